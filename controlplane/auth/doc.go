// Package auth decides who may call the control plane's TableService.
//
// Identities come from the API server, never from messages: every call
// carries "authorization: Bearer <token>", which the Authenticator checks
// with a TokenReview when a stream or call starts (its interceptors), and
// puts the resulting Identity in the call's context. Two kinds of token
// are accepted:
//
//   - agent tokens: projected ServiceAccount tokens with the control
//     plane's audience (--token-audience), of the agents' ServiceAccount,
//     bound to an agent Pod (the TokenReview's user extras
//     authentication.kubernetes.io/pod-name and pod-uid). The Pod, as the
//     Authenticator's watch of the agents' Pods sees it, must exist with
//     that uid and be controlled by the agents' DaemonSet; its node is the
//     one such a token may Sync and WatchTable, and no other. Tokens bound
//     to a Node, or to nothing, prove no node.
//   - reader tokens: any other token the API server accepts for the same
//     audience (kubectl create token --audience), whose user may list
//     EndpointSlices cluster-wide (a SubjectAccessReview). Tables and
//     status are computed from EndpointSlices, so such a user learns
//     nothing new by reading every table, node list and event. Tokens for
//     the API server's own audiences are refused unreviewed: no caller
//     hands a replica a token it could replay against the API server.
//
// A stream stays under check while it lasts (guard): it ends when its
// token expires, when its agent Pod goes, and when a periodic fresh
// review finds its identity or rights gone.
//
// Reviews are cached by a hash of the token (never the token), bounded in
// time and size, and bounded in concurrency, so a reconnect storm or a
// flood of bad tokens costs the API server a bounded load.
package auth
