// Package config is the control plane's configuration file: a versioned
// ControlPlaneConfiguration (controlplane.proxyplane.io/v1alpha1) holding
// what its flags hold, decoded strictly with apimachinery's serializer as
// Kubernetes components decode theirs. Every field is optional: an unset
// field leaves the flag's value (or default), and a flag given on the
// command line wins over the file.
package config

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the configuration's API group.
const GroupName = "controlplane.proxyplane.io"

// SchemeGroupVersion is the version this package decodes.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

// ControlPlaneConfiguration configures the control plane; each field is
// the flag of the same name (in camelCase) and documented there.
type ControlPlaneConfiguration struct {
	metav1.TypeMeta `json:",inline"`

	Kubeconfig                   *string          `json:"kubeconfig,omitempty"`
	GRPCAddress                  *string          `json:"grpcAddress,omitempty"`
	MetricsAddress               *string          `json:"metricsAddress,omitempty"`
	ResyncPeriod                 *metav1.Duration `json:"resyncPeriod,omitempty"`
	MaxPendingChanges            *int32           `json:"maxPendingChanges,omitempty"`
	MaxSendMessageBytes          *int32           `json:"maxSendMessageBytes,omitempty"`
	MaxRecvMessageBytes          *int32           `json:"maxRecvMessageBytes,omitempty"`
	MaxStreamsPerConnection      *int32           `json:"maxStreamsPerConnection,omitempty"`
	KeepaliveInterval            *metav1.Duration `json:"keepaliveInterval,omitempty"`
	KeepaliveTimeout             *metav1.Duration `json:"keepaliveTimeout,omitempty"`
	WriteTimeout                 *metav1.Duration `json:"writeTimeout,omitempty"`
	AckTimeout                   *metav1.Duration `json:"ackTimeout,omitempty"`
	Logging                      Logging          `json:"logging,omitempty"`
	TLS                          TLS              `json:"tls,omitempty"`
	Namespace                    *string          `json:"namespace,omitempty"`
	TokenAudience                *string          `json:"tokenAudience,omitempty"`
	AgentServiceAccount          *string          `json:"agentServiceAccount,omitempty"`
	AgentDaemonSet               *string          `json:"agentDaemonset,omitempty"`
	IdentityRecheckInterval      *metav1.Duration `json:"identityRecheckInterval,omitempty"`
	MaxAgents                    *int32           `json:"maxAgents,omitempty"`
	MaxStreams                   *int32           `json:"maxStreams,omitempty"`
	MaxConnections               *int32           `json:"maxConnections,omitempty"`
	PeerRate                     *float64         `json:"peerRate,omitempty"`
	PeerBurst                    *int32           `json:"peerBurst,omitempty"`
	AdmissionRate                *float64         `json:"admissionRate,omitempty"`
	AdmissionBurst               *int32           `json:"admissionBurst,omitempty"`
	AgentControlPlane            []string         `json:"agentControlPlane,omitempty"`
	ServiceNodePortRange         *string          `json:"serviceNodePortRange,omitempty"`
	AllowNodeAddressServicePorts *bool            `json:"allowNodeAddressServicePorts,omitempty"`
	ConvergenceTracking          *bool            `json:"convergenceTracking,omitempty"`
	Profiling                    *bool            `json:"profiling,omitempty"`
}

// Logging is --log-level, --v and --logging-format.
type Logging struct {
	Level     *string `json:"level,omitempty"`
	Verbosity *int32  `json:"verbosity,omitempty"`
	Format    *string `json:"format,omitempty"`
}

// TLS is --tls-cert-file, --tls-private-key-file and --tls-san.
type TLS struct {
	CertFile       *string  `json:"certFile,omitempty"`
	PrivateKeyFile *string  `json:"privateKeyFile,omitempty"`
	SANs           []string `json:"sans,omitempty"`
}

// DeepCopyObject implements runtime.Object: a copy sharing no pointer or
// slice with c (TestDeepCopyObject fails on a field added and not copied
// here).
func (c *ControlPlaneConfiguration) DeepCopyObject() runtime.Object {
	out := *c
	for _, p := range []**string{
		&out.Kubeconfig, &out.GRPCAddress, &out.MetricsAddress, &out.Namespace, &out.TokenAudience,
		&out.AgentServiceAccount, &out.Logging.Level, &out.Logging.Format, &out.TLS.CertFile, &out.TLS.PrivateKeyFile,
		&out.AgentDaemonSet, &out.ServiceNodePortRange,
	} {
		*p = clone(*p)
	}
	for _, p := range []**metav1.Duration{
		&out.ResyncPeriod, &out.KeepaliveInterval, &out.KeepaliveTimeout, &out.WriteTimeout, &out.AckTimeout,
		&out.IdentityRecheckInterval,
	} {
		*p = clone(*p)
	}
	for _, p := range []**int32{
		&out.MaxPendingChanges, &out.MaxSendMessageBytes, &out.MaxRecvMessageBytes, &out.MaxStreamsPerConnection,
		&out.Logging.Verbosity, &out.MaxAgents, &out.MaxStreams, &out.MaxConnections, &out.PeerBurst, &out.AdmissionBurst,
	} {
		*p = clone(*p)
	}
	out.PeerRate, out.AdmissionRate = clone(out.PeerRate), clone(out.AdmissionRate)
	out.TLS.SANs = append([]string(nil), c.TLS.SANs...)
	out.AgentControlPlane = append([]string(nil), c.AgentControlPlane...)
	out.AllowNodeAddressServicePorts = clone(out.AllowNodeAddressServicePorts)
	out.ConvergenceTracking = clone(out.ConvergenceTracking)
	out.Profiling = clone(out.Profiling)
	return &out
}

func clone[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}
