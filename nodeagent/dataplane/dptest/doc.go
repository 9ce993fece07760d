// Package dptest is what the dataplanes' tests share: tables built the way
// the agent receives them, the feature cases their goldens and packet
// traces are named after, the flows traced through each case, scale tables
// for benchmarks, random changes for convergence tests, the real-kernel
// test Services, and helpers for golden files and iptables rule text.
//
// It is test support: only _test.go files import it.
package dptest
