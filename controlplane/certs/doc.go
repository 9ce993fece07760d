// Package certs supplies the control plane's serving certificate, from one
// of two sources:
//
//   - FileSource reads a certificate and key that someone else issued
//     (--tls-cert-file, --tls-private-key-file) and reloads them when the
//     files change, as kube components do: new handshakes get the new
//     certificate, established connections keep theirs.
//   - Bootstrapper needs nothing set up: it keeps a CA in the Secret
//     proxyplane-ca of the control plane's namespace (created once, by
//     whichever replica gets there first, with the namespace if need be),
//     issues each replica a serving certificate in memory signed by it,
//     renews that before it expires, and publishes the CA certificate in
//     the ConfigMap proxyplane-ca (key ca.crt) for agents to verify
//     against, as Antrea does with antrea-ca. Its own CA lives a year and
//     is rotated with an overlap: the bundle holds the old and the new CA
//     from an hour before the new one signs until an hour after. A CA an
//     operator put in the Secret is checked (ParseCA) before it is
//     trusted, and never changed.
//
// Both serve tls.Config.GetCertificate and never block a handshake on the
// API server or the disk beyond reading two small files.
package certs
