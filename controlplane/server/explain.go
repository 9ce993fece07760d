package server

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// Explain implements TableService: node's entry for one Service, with
// the decisions behind it (compute.Service.Explain), the version of the
// node's table holding it, and whether the node's agent acknowledged that
// version on this replica. It is authorized as WatchTable of the node
// (AuthorizeRead), before anything is looked up, so that a caller without
// rights learns nothing, not even which names exist.
func (s *Server) Explain(ctx context.Context, req *pb.ExplainRequest) (*pb.ExplainResponse, error) {
	from, err := validExplain(req)
	if err != nil {
		return nil, toStatus(err)
	}
	if err := s.authorizeRead(ctx, req.GetNodeName()); err != nil {
		return nil, err
	}
	w, err := s.world(ctx)
	if err != nil {
		return nil, err
	}
	name := req.GetNodeName()
	res, connected, seen := s.reg.result(name)
	if !w.Known(name) && !connected {
		return nil, status.Errorf(codes.NotFound, "node %q: no Node object of that name, and no agent of that name connected to this replica", name)
	}
	key := compute.Key(req.GetNamespace(), req.GetName())
	svc := w.Service(key)
	if svc == nil {
		return nil, status.Errorf(codes.NotFound,
			"Service %s is in no table: it does not exist, or it is not proxied (headless, ExternalName, labelled %s, or invalid: see ListEvents)",
			key, compute.LabelServiceProxyName)
	}
	node := w.Node(name)
	view, ex := svc.Explain(node)
	if p := req.GetPort(); p != "" {
		ex.Ports = slices.DeleteFunc(ex.Ports, func(pe *pb.PortExplanation) bool { return !portMatches(pe, p) })
		if len(ex.Ports) == 0 {
			return nil, status.Errorf(codes.NotFound, "Service %s has no port named or numbered %q (ports: %s)", key, p, portList(view))
		}
	}
	if from.IsValid() {
		ex.Source = compute.CheckSource(view, from, node.IPs())
	}
	version := compute.FormatVersion(w.Version(node))
	out := &pb.ExplainResponse{
		NodeName: name, Zone: node.Zone, Registered: w.Known(name),
		Key:             key,
		Version:         version,
		EntryHash:       compute.FormatVersion(svc.EntryFor(node).Hash),
		ResourceVersion: w.ResourceVersion(),
		Connected:       connected,
		Service:         ex,
	}
	if seen && res.acked {
		out.AckedVersion = compute.FormatVersion(res.ackedVersion)
		if !res.ackedAt.IsZero() {
			out.AckedAt = timestamppb.New(res.ackedAt)
		}
		out.Acknowledged = out.AckedVersion == version
	}
	return out, nil
}

// maxPortLen bounds ExplainRequest.port: a port name is a DNS label of at
// most 15 characters, a number at most 5 digits.
const maxPortLen = 63

// validExplain checks a request before anything is looked up, and parses
// its source address.
func validExplain(req *pb.ExplainRequest) (netip.Addr, error) {
	if err := validNodeName(req.GetNodeName()); err != nil {
		return netip.Addr{}, err
	}
	if req.GetNamespace() == "" || req.GetName() == "" {
		return netip.Addr{}, fmt.Errorf("%w: namespace and name of the Service are required", errInvalid)
	}
	if errs := validation.IsDNS1123Label(req.GetNamespace()); len(errs) > 0 {
		return netip.Addr{}, fmt.Errorf("%w: namespace %q: %s", errInvalid, req.GetNamespace(), errs[0])
	}
	// Services created before the API server required DNS-1035 labels may
	// have DNS-1123 ones: the looser check.
	if errs := validation.IsDNS1123Label(req.GetName()); len(errs) > 0 {
		return netip.Addr{}, fmt.Errorf("%w: Service name %q: %s", errInvalid, req.GetName(), errs[0])
	}
	if len(req.GetPort()) > maxPortLen {
		return netip.Addr{}, fmt.Errorf("%w: port is %d bytes, more than %d", errInvalid, len(req.GetPort()), maxPortLen)
	}
	if req.GetFrom() == "" {
		return netip.Addr{}, nil
	}
	from, err := netip.ParseAddr(req.GetFrom())
	if err != nil || from.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%w: from %q is not an IP address", errInvalid, req.GetFrom())
	}
	return from.Unmap(), nil
}

// portMatches reports whether p names pe: its name, its port or its node
// port.
func portMatches(pe *pb.PortExplanation, p string) bool {
	if pe.GetName() == p {
		return true
	}
	n, err := strconv.ParseInt(p, 10, 32)
	return err == nil && n > 0 && (int32(n) == pe.GetPort() || int32(n) == pe.GetNodePort())
}

// portList names svc's ports for a NotFound message.
func portList(svc *pb.Service) string {
	var out []byte
	for i, p := range svc.GetPorts() {
		if i > 0 {
			out = append(out, ", "...)
		}
		if p.GetName() != "" {
			out = append(out, p.GetName()...)
			out = append(out, ' ')
		}
		out = strconv.AppendInt(out, int64(p.GetPort()), 10)
		out = append(out, '/')
		out = append(out, strings.TrimPrefix(p.GetProtocol().String(), "PROTOCOL_")...)
	}
	if len(out) == 0 {
		return "none"
	}
	return string(out)
}

// result returns what this replica knows of node's agent: its connected
// stream's result, or the last one's; seen is false when the registry
// holds nothing of it.
func (r *registry) result(node string) (res syncResult, connected, seen bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.nodes[node]
	if e == nil {
		return syncResult{}, false, false
	}
	if e.stream != nil {
		return e.stream.result(), true, true
	}
	return e.last, false, true
}
