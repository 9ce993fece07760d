// Package auth decides who may call the control plane's TableService.
//
// Identities come from the API server, never from messages: every call
// carries "authorization: Bearer <token>", which the Authenticator checks
// with a TokenReview when a stream or call starts (its interceptors), and
// puts the resulting Identity in the call's context. Two kinds of token
// are accepted:
//
//   - agent tokens: projected ServiceAccount tokens with the agents'
//     audience (--token-audience), of the agents' ServiceAccount, bound to
//     the agent's Pod and therefore to its node (the TokenReview's user
//     extra authentication.kubernetes.io/node-name). Such a token may Sync
//     and WatchTable that node only.
//   - reader tokens: any token the API server accepts for its own
//     audiences (kubectl create token, a user's credentials), whose user
//     may list EndpointSlices cluster-wide (a SubjectAccessReview). Tables
//     and status are computed from EndpointSlices, so such a user learns
//     nothing new by reading every table, node list and event.
//
// Reviews are cached by a hash of the token (never the token), bounded in
// time and size, and bounded in concurrency, so a reconnect storm or a
// flood of bad tokens costs the API server a bounded load.
package auth
