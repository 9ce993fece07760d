module github.com/proxyplane/proxyplane/e2e/internal/readyline

go 1.26.0
