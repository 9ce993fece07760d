package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestAnswers: every line on a TCP connection and every datagram is
// answered with the name and the client's address, as nstest's servers
// answer, and HTTP / the same.
func TestAnswers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { serveTCP(ln, "pod-a", 10*time.Second, &wg) })
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	want := fmt.Sprintf("pod-a %s\n", c.LocalAddr())
	for i := range 2 {
		if _, err := io.WriteString(c, "hi\n"); err != nil {
			t.Fatal(err)
		}
		if got, err := r.ReadString('\n'); err != nil || got != want {
			t.Errorf("TCP answer %d = %q, %v; want %q", i, got, err, want)
		}
	}

	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() { serveUDP(pc, "pod-a") })
	t.Cleanup(func() { _ = pc.Close() })
	u, err := net.Dial("udp", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = u.Close() }()
	if err := u.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(u, "hi\n"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, maxLine)
	n, err := u.Read(buf)
	if want := fmt.Sprintf("pod-a %s\n", u.LocalAddr()); err != nil || string(buf[:n]) != want {
		t.Errorf("UDP answer = %q, %v; want %q", buf[:n], err, want)
	}

	srv := httptest.NewServer(handler("pod-a", newProber(nil)))
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if !strings.HasPrefix(string(body), "pod-a 127.0.0.1:") {
		t.Errorf("HTTP answer %q", body)
	}
}
