package proxytable

import (
	"errors"
	"fmt"
	"net/netip"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// ErrInvalidTable is wrapped by every validation failure; the agent NACKs
// such a response and keeps its table.
var ErrInvalidTable = errors.New("invalid table")

// EntryError is a validation failure pinned to one entry, reported in the
// NACK's entry_errors.
type EntryError struct {
	// Key of the entry.
	Key string
	// Err says what is wrong.
	Err error
}

func (e *EntryError) Error() string { return e.Key + ": " + e.Err.Error() }

// Unwrap returns the underlying error.
func (e *EntryError) Unwrap() error { return e.Err }

// ValidationError lists everything wrong with a table response. It
// matches ErrInvalidTable with errors.Is.
type ValidationError struct {
	// Entries are the failures pinned to entries.
	Entries []*EntryError
	// Table are the failures of the table as a whole.
	Table []error
}

func (e *ValidationError) Error() string {
	errs := make([]error, 0, len(e.Entries)+len(e.Table))
	for _, ee := range e.Entries {
		errs = append(errs, ee)
	}
	return ErrInvalidTable.Error() + ": " + errors.Join(append(errs, e.Table...)...).Error()
}

// Is reports whether target is ErrInvalidTable.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalidTable }

// EntryErrors returns the failures pinned to entries of the
// ValidationError in err's chain, as a NACK carries them; nil when err
// holds none.
func EntryErrors(err error) []*pb.EntryError {
	var ve *ValidationError
	if !errors.As(err, &ve) || len(ve.Entries) == 0 {
		return nil
	}
	out := make([]*pb.EntryError, 0, len(ve.Entries))
	for _, e := range ve.Entries {
		out = append(out, &pb.EntryError{Key: e.Key, Error: e.Err.Error()})
	}
	return out
}

// ValidateEntry checks everything a dataplane relies on: the key matches
// the Service, addresses parse, ports and protocols are in range, and
// every endpoint list names a port of the Service.
func ValidateEntry(e *pb.ServiceEntry) *EntryError {
	if err := validateService(e.GetKey(), e.GetService()); err != nil {
		return &EntryError{Key: e.GetKey(), Err: err}
	}
	return nil
}

func validateService(key string, s *pb.Service) error {
	if s == nil {
		return errors.New("no service")
	}
	if s.GetNamespace() == "" || s.GetName() == "" || key != s.GetNamespace()+"/"+s.GetName() {
		return fmt.Errorf("key does not match service %s/%s", s.GetNamespace(), s.GetName())
	}
	if len(s.GetClusterIps()) == 0 {
		return errors.New("no cluster IP")
	}
	for _, list := range [][]string{s.GetClusterIps(), s.GetExternalIps(), s.GetLoadBalancerIps()} {
		for _, ip := range list {
			if _, err := netip.ParseAddr(ip); err != nil {
				return fmt.Errorf("address: %w", err)
			}
		}
	}
	for _, r := range s.GetLoadBalancerSourceRanges() {
		if _, err := netip.ParsePrefix(r); err != nil {
			return fmt.Errorf("source range: %w", err)
		}
	}
	if p := s.GetHealthCheckNodePort(); p < 0 || p > 65535 {
		return fmt.Errorf("healthCheckNodePort %d out of range", p)
	}
	if a := s.GetSessionAffinity(); a != nil && (a.GetTimeoutSeconds() < 1 || a.GetTimeoutSeconds() > 86400) {
		return fmt.Errorf("affinity timeout %d out of range", a.GetTimeoutSeconds())
	}
	ports := map[string]bool{}
	for _, p := range s.GetPorts() {
		switch {
		case ports[p.GetName()]:
			return fmt.Errorf("duplicate port %q", p.GetName())
		case p.GetProtocol() == pb.Protocol_PROTOCOL_UNSPECIFIED || pb.Protocol_name[int32(p.GetProtocol())] == "":
			return fmt.Errorf("port %q: unknown protocol %d", p.GetName(), p.GetProtocol())
		case p.GetPort() < 1 || p.GetPort() > 65535:
			return fmt.Errorf("port %q: port %d out of range", p.GetName(), p.GetPort())
		case p.GetNodePort() < 0 || p.GetNodePort() > 65535:
			return fmt.Errorf("port %q: nodePort %d out of range", p.GetName(), p.GetNodePort())
		}
		ports[p.GetName()] = true
	}
	for _, set := range [][]*pb.PortEndpoints{s.GetClusterEndpoints(), s.GetLocalEndpoints()} {
		for _, pe := range set {
			if !ports[pe.GetPortName()] {
				return fmt.Errorf("endpoints for unknown port %q", pe.GetPortName())
			}
			for _, ep := range pe.GetEndpoints() {
				if _, err := netip.ParseAddr(ep.GetIp()); err != nil {
					return fmt.Errorf("endpoint: %w", err)
				}
				if ep.GetPort() < 1 || ep.GetPort() > 65535 {
					return fmt.Errorf("endpoint %s: port %d out of range", ep.GetIp(), ep.GetPort())
				}
			}
		}
	}
	return nil
}

// validateServiceCIDRs checks that each service CIDR is a prefix in
// canonical form, as the control plane sends them: a dataplane drops
// traffic to them, so one it could not read would leave addresses routed
// off the node without a word, and one with host bits set would be read
// differently by different dataplanes.
func validateServiceCIDRs(cidrs []string) error {
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return fmt.Errorf("service CIDR: %w", err)
		}
		if p.Masked() != p {
			return fmt.Errorf("service CIDR %q: host bits set, want %s", c, p.Masked())
		}
	}
	return nil
}
