package nftables

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
)

// kernel is the Dataplane's seam to nf_tables. The netlink implementation
// is below; the tests use a fake that applies transactions to a model with
// the kernel's rules (references must exist, referenced objects cannot be
// deleted, a failed transaction changes nothing).
type kernel interface {
	// Run applies tx to the family's table atomically: entirely or not at
	// all. A refusal is a *TransactionError (nothing applied); a failure
	// to talk to the kernel is a *SocketError, after which the outcome is
	// unknown if it says Sent. Not safe for concurrent use.
	Run(ctx context.Context, tx *transaction) error
	// List returns the chains and sets of the family's table, nil when
	// the table does not exist. Read-only.
	List(ctx context.Context) (*inventory, error)
	// Gen returns the ruleset generation of the network namespace
	// (NFT_MSG_GETGEN): nf_tables bumps it by one at every commit that
	// changes anything, in any table of any family, whoever sends it, and
	// never otherwise (packets updating a dynamic set do not). Read-only
	// and cheap: one small request and answer.
	Gen(ctx context.Context) (uint32, error)
}

// netlinkKernel talks to nf_tables over a NETLINK_NETFILTER socket opened
// in the configured network namespace. The socket is opened on first use
// and reopened after a socket failure.
type netlinkKernel struct {
	family dataplane.Family
	netns  string
	fd     int // -1 when closed
	seq    uint32
}

func newNetlinkKernel(family dataplane.Family, netnsPath string) *netlinkKernel {
	return &netlinkKernel{family: family, netns: netnsPath, fd: -1, seq: uint32(time.Now().Unix())}
}

// recvTimeout bounds each wait for the kernel's answer. The kernel
// processes a batch inside sendmsg, so the answer is queued by the time
// we read; the timeout only guards against a kernel that never answers.
const recvTimeout = 30 * time.Second

// rcvBuf is the receive buffer asked for: dumps of a 10k-Service table come
// in many messages, and it is charged only as used.
const rcvBuf = 8 << 20

func (k *netlinkKernel) socket() (int, error) {
	if k.fd >= 0 {
		return k.fd, nil
	}
	fd, err := socketIn(k.netns)
	if err != nil {
		return -1, err
	}
	k.fd = fd
	return fd, nil
}

// closeSocket drops the socket after a failure, so that stale answers in
// its buffer never meet the next request.
func (k *netlinkKernel) closeSocket() {
	if k.fd >= 0 {
		_ = unix.Close(k.fd)
		k.fd = -1
	}
}

// socketIn opens a netfilter netlink socket in namespace path ("" for the
// current one). A socket stays in the namespace it was created in, so the
// thread switches namespace only for the socket call, on a goroutine of
// its own: if switching back fails the thread stays locked and dies with
// the goroutine rather than serve others in the wrong namespace.
func socketIn(path string) (int, error) {
	if path == "" {
		return newSocket()
	}
	type result struct {
		fd  int
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		target, err := netns.GetFromPath(path)
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{-1, &SocketError{Op: "opening namespace " + path, Err: err}}
			return
		}
		defer func() { _ = target.Close() }()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{-1, &SocketError{Op: "getting the current namespace", Err: err}}
			return
		}
		defer func() { _ = orig.Close() }()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			done <- result{-1, &SocketError{Op: "entering namespace " + path, Err: err}}
			return
		}
		fd, err := newSocket()
		if rerr := netns.Set(orig); rerr != nil {
			if fd >= 0 {
				_ = unix.Close(fd)
			}
			done <- result{-1, &SocketError{Op: "leaving namespace " + path, Err: rerr}}
			return // the thread stays locked and is discarded
		}
		runtime.UnlockOSThread()
		done <- result{fd, err}
	}()
	r := <-done
	return r.fd, r.err
}

func newSocket() (int, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return -1, &SocketError{Op: "opening a netfilter netlink socket", Err: err}
	}
	fail := func(op string, err error) (int, error) {
		_ = unix.Close(fd)
		return -1, &SocketError{Op: op, Err: err}
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fail("binding the netlink socket", err)
	}
	// Errors carry only the failing message's header, not the whole
	// message back, and the kernel's explanation as an attribute.
	for _, opt := range []int{unix.NETLINK_CAP_ACK, unix.NETLINK_EXT_ACK} {
		if err := unix.SetsockoptInt(fd, unix.SOL_NETLINK, opt, 1); err != nil {
			return fail("setting netlink socket options", err)
		}
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcvBuf); err != nil {
		// Without CAP_NET_ADMIN in the namespace nothing else works
		// either; the plain option is capped but harmless.
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, rcvBuf)
	}
	tv := unix.NsecToTimeval(recvTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return fail("setting the receive timeout", err)
	}
	return fd, nil
}

// Run implements kernel.
func (k *netlinkKernel) Run(ctx context.Context, tx *transaction) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b, err := encodeBatch(tx, k.family, k.seq)
	if err != nil {
		return err
	}
	if len(b.msgOp) == 0 {
		return nil
	}
	k.seq = b.last + 2
	fd, err := k.socket()
	if err != nil {
		return err
	}
	// The whole batch goes in one sendmsg: nfnetlink commits what one
	// message buffer holds. The send buffer must hold it all (nft does
	// the same); FORCE lifts the net.core.wmem_max cap. The chunks are
	// one sendmsg's buffers, gathered into one message by the kernel.
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, b.size+(64<<10)); err != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, b.size+(64<<10))
	}
	if err := sendBatch(fd, b); err != nil {
		k.closeSocket()
		return &SocketError{Op: fmt.Sprintf("sending a %d-byte batch", b.size), Err: err}
	}
	refusals, err := k.readAcks(fd, b)
	if err != nil {
		k.closeSocket()
		return err
	}
	if len(refusals) == 0 {
		return nil
	}
	return k.transactionError(tx, b, refusals)
}

// sendBatch sends b's chunks in one sendmsg: one netlink message
// buffer, as if they were one slice.
func sendBatch(fd int, b *batch) error {
	for {
		n, err := unix.SendmsgBuffers(fd, b.bufs, nil, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err == nil && n != b.size {
			return fmt.Errorf("sent %d of %d bytes", n, b.size)
		}
		return err
	}
}

func sendAll(fd int, buf []byte) error {
	for {
		err := unix.Sendto(fd, buf, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// refusal is an error message the kernel sent about one message.
type refusal struct {
	seq   uint32
	errno syscall.Errno
	msg   string
	// offset is the kernel's pointer to the offending attribute in the
	// message (NLMSGERR_ATTR_OFFS), 0 when it gave none.
	offset uint32
}

// readAcks reads the kernel's answers to b until the acknowledgement (or
// error) of its last message, and returns the errors among them. The
// kernel reports every failing message, then the requested
// acknowledgement; a commit that fails as a whole is reported against the
// batch's first message.
func (k *netlinkKernel) readAcks(fd int, b *batch) ([]refusal, error) {
	buf := make([]byte, 64<<10)
	var out []refusal
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, &SocketError{Op: "reading the kernel's answer", Sent: true, Err: err}
		}
		msgs := buf[:n]
		for len(msgs) >= nlmsgHdrLen {
			l := int(binary.NativeEndian.Uint32(msgs))
			if l < nlmsgHdrLen || l > len(msgs) {
				return nil, &SocketError{Op: "reading the kernel's answer", Sent: true, Err: errors.New("malformed netlink message")}
			}
			typ := binary.NativeEndian.Uint16(msgs[4:])
			flags := binary.NativeEndian.Uint16(msgs[6:])
			seq := binary.NativeEndian.Uint32(msgs[8:])
			body := msgs[nlmsgHdrLen:l]
			msgs = msgs[nlmsgAlign(l):]
			if typ != unix.NLMSG_ERROR || len(body) < 4 || seq < b.first-1 || seq > b.last {
				continue // not an answer to this batch
			}
			code := int32(binary.NativeEndian.Uint32(body))
			if code != 0 {
				msg, off := extAck(body, flags)
				out = append(out, refusal{seq: seq, errno: syscall.Errno(-code), msg: msg, offset: off})
			}
			if seq == b.last {
				return out, nil
			}
		}
	}
}

func nlmsgAlign(n int) int { return (n + 3) &^ 3 }

// extAck returns the kernel's explanation (NLMSGERR_ATTR_MSG) and the
// offset of the offending attribute (NLMSGERR_ATTR_OFFS), if given. With
// NETLINK_CAP_ACK the error carries only the original header.
func extAck(body []byte, flags uint16) (msg string, offset uint32) {
	if flags&unix.NLM_F_ACK_TLVS == 0 || len(body) < 4+nlmsgHdrLen {
		return "", 0
	}
	for _, a := range parseAttrs(body[4+nlmsgHdrLen:]) {
		switch a.typ {
		case unix.NLMSGERR_ATTR_MSG:
			msg = cString(a.data)
		case unix.NLMSGERR_ATTR_OFFS:
			if len(a.data) >= 4 {
				offset = binary.NativeEndian.Uint32(a.data)
			}
		}
	}
	return msg, offset
}

// transactionError describes the first refused operation.
func (k *netlinkKernel) transactionError(tx *transaction, b *batch, refusals []refusal) error {
	first := refusals[0]
	te := &TransactionError{Family: k.family, Errno: first.errno, Message: first.msg, Refused: len(refusals)}
	if i := int(first.seq) - int(b.first); i >= 0 && i < len(b.msgOp) {
		o := tx.op(int(b.msgOp[i]))
		te.Op, te.Key = o.text(k.family), o.owner
		if m, ok := b.elems[i]; ok {
			// Name the refused element, not the thousands around it.
			if j := b.element(m, first.offset); first.offset != 0 && j >= 0 {
				el := o.element(j)
				te.Op, te.Key = el.text(k.family), el.owner
			} else {
				te.Op = fmt.Sprintf("%s (one of %d elements)", o.element(m.first).text(k.family), m.n())
				te.Key = ""
			}
		}
	}
	return te
}

// List implements kernel.
func (k *netlinkKernel) List(ctx context.Context) (*inventory, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	fd, err := k.socket()
	if err != nil {
		return nil, err
	}
	fam := byte(unix.NFPROTO_IPV4)
	if k.family == dataplane.IPv6 {
		fam = unix.NFPROTO_IPV6
	}
	e := &encoder{fam: fam, seq: k.seq}
	request := func(typ uint16, flags uint16, attr uint16) ([]byte, uint32) {
		e.b = e.b[:0]
		seq := e.seq
		start := e.header(unix.NFNL_SUBSYS_NFTABLES<<8|typ, unix.NLM_F_REQUEST|flags, fam)
		e.str(attr, TableName)
		e.finish(start)
		return e.b, seq
	}
	// Does the table exist? The set dump fails on a missing table.
	msg, seq := request(unix.NFT_MSG_GETTABLE, unix.NLM_F_ACK, unix.NFTA_TABLE_NAME)
	err = k.dump(fd, msg, seq, nil)
	k.seq = e.seq
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	inv := &inventory{chains: map[string]bool{}, sets: map[string]bool{}}
	msg, seq = request(unix.NFT_MSG_GETCHAIN, unix.NLM_F_DUMP, unix.NFTA_CHAIN_TABLE)
	err = k.dump(fd, msg, seq, func(attrs []attr) {
		var name, table string
		base := false
		for _, a := range attrs {
			switch a.typ {
			case unix.NFTA_CHAIN_NAME:
				name = cString(a.data)
			case unix.NFTA_CHAIN_TABLE:
				table = cString(a.data)
			case unix.NFTA_CHAIN_HOOK:
				base = true
			}
		}
		if table == TableName && name != "" {
			inv.chains[name] = base
		}
	})
	if err != nil {
		return nil, err
	}
	msg, seq = request(unix.NFT_MSG_GETSET, unix.NLM_F_DUMP, unix.NFTA_SET_TABLE)
	err = k.dump(fd, msg, seq, func(attrs []attr) {
		var name, table string
		var flags uint32
		for _, a := range attrs {
			switch a.typ {
			case unix.NFTA_SET_NAME:
				name = cString(a.data)
			case unix.NFTA_SET_TABLE:
				table = cString(a.data)
			case unix.NFTA_SET_FLAGS:
				if len(a.data) >= 4 {
					flags = binary.BigEndian.Uint32(a.data)
				}
			}
		}
		// Anonymous sets belong to their rule and go with it.
		if table == TableName && name != "" && flags&unix.NFT_SET_ANONYMOUS == 0 {
			inv.sets[name] = flags&unix.NFT_SET_MAP != 0
		}
	})
	k.seq = e.seq
	if err != nil {
		return nil, err
	}
	return inv, nil
}

// Gen implements kernel.
func (k *netlinkKernel) Gen(ctx context.Context) (uint32, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	fd, err := k.socket()
	if err != nil {
		return 0, err
	}
	e := &encoder{seq: k.seq}
	start := e.header(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETGEN, unix.NLM_F_REQUEST|unix.NLM_F_ACK, unix.AF_UNSPEC)
	e.finish(start)
	k.seq = e.seq
	var gen uint32
	found := false
	err = k.dump(fd, e.b, e.seq-1, func(attrs []attr) {
		for _, a := range attrs {
			if a.typ == unix.NFTA_GEN_ID && len(a.data) >= 4 {
				gen, found = binary.BigEndian.Uint32(a.data), true
			}
		}
	})
	if err != nil {
		return 0, fmt.Errorf("getting the ruleset generation: %w", err)
	}
	if !found {
		return 0, &SocketError{Op: "getting the ruleset generation", Err: errors.New("no generation in the kernel's answer")}
	}
	return gen, nil
}

// dump sends a request and passes each answer's attributes to each (nil
// to ignore them) until the dump ends or the acknowledgement arrives. An
// error the kernel reports is returned as its errno.
func (k *netlinkKernel) dump(fd int, req []byte, seq uint32, each func([]attr)) error {
	if err := sendAll(fd, req); err != nil {
		k.closeSocket()
		return &SocketError{Op: "sending a dump request", Err: err}
	}
	buf := make([]byte, 1<<20)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			k.closeSocket()
			return &SocketError{Op: "reading a dump", Err: err}
		}
		msgs := buf[:n]
		for len(msgs) >= nlmsgHdrLen {
			l := int(binary.NativeEndian.Uint32(msgs))
			if l < nlmsgHdrLen || l > len(msgs) {
				k.closeSocket()
				return &SocketError{Op: "reading a dump", Err: errors.New("malformed netlink message")}
			}
			typ := binary.NativeEndian.Uint16(msgs[4:])
			mseq := binary.NativeEndian.Uint32(msgs[8:])
			body := msgs[nlmsgHdrLen:l]
			msgs = msgs[nlmsgAlign(l):]
			if mseq != seq {
				continue
			}
			switch typ {
			case unix.NLMSG_DONE:
				return nil
			case unix.NLMSG_ERROR:
				if len(body) >= 4 {
					if code := int32(binary.NativeEndian.Uint32(body)); code != 0 {
						return syscall.Errno(-code)
					}
				}
				return nil
			default:
				if each != nil && len(body) >= nfgenLen {
					each(parseAttrs(body[nfgenLen:]))
				}
			}
		}
	}
}

// attr is one netlink attribute.
type attr struct {
	typ  uint16
	data []byte
}

// parseAttrs splits b into attributes, the nested flag cleared.
func parseAttrs(b []byte) []attr {
	var out []attr
	for len(b) >= nlaHdrLen {
		l := int(binary.NativeEndian.Uint16(b))
		if l < nlaHdrLen || l > len(b) {
			break
		}
		out = append(out, attr{typ: binary.NativeEndian.Uint16(b[2:]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER), data: b[nlaHdrLen:l]})
		b = b[min(nlmsgAlign(l), len(b)):]
	}
	return out
}

func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
