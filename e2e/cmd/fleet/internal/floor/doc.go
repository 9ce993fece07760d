// Package floor measures what grpc-go itself costs on this machine for
// the control plane's steady work: one small message sent to each of N
// agents on its own TCP connection, one small reply received back. It is
// the fleet harness's "gRPC floor" phase, and runs as two of its child
// processes.
//
// The server process (ServerMain) serves one bidirectional streaming
// method with the control plane's transport options
// (controlplane/server.GRPCOptions) and the least a server can do on top:
// a handler goroutine and a receive goroutine per stream, as the control
// plane's Sync has, woken by closing a shared channel per round, as the
// control plane's store wakes its streams; each stream sends one
// pre-encoded message and waits for the reply. The clients' process
// (ClientsMain) holds N clients, each on its own grpc.ClientConn from its
// own loopback address with the agent's transport options
// (nodeagent/client.TransportOptions), each answering every message at
// once.
//
// The harness drives the server over a local HTTP endpoint: POST /run runs
// the rounds at a pace; GET /report says how many streams are open and
// when each round's last reply came. What the control plane costs above
// these figures is its own work, not gRPC's.
package floor
