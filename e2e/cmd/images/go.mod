// This module builds the container images offline (`make images`). It is a
// module of its own so that go-containerregistry and its dependencies stay
// out of proxyplane's and the e2e tests'.
module github.com/proxyplane/proxyplane/e2e/cmd/images

go 1.26.0

require (
	github.com/google/go-containerregistry v0.22.1
	github.com/spf13/pflag v1.0.10
)

require (
	github.com/klauspost/compress v1.19.2 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
)
