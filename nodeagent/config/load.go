package config

import (
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	kubeproxy "k8s.io/kube-proxy/config/v1alpha1"
)

var (
	scheme  = newScheme()
	strict  = serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
	lenient = serializer.NewCodecFactory(scheme, serializer.DisableStrict).UniversalDeserializer()
)

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := kubeproxy.AddToScheme(s); err != nil {
		panic(fmt.Sprintf("registering KubeProxyConfiguration: %v", err))
	}
	return s
}

// Decode decodes a KubeProxyConfiguration in YAML or JSON. As kube-proxy's
// loadConfig: strictly first; when only strictness fails (an unknown or
// duplicate field), leniently, returning the strict error as lenientErr for
// the caller to log. Any other kind or apiVersion is an error.
func Decode(data []byte) (cfg *kubeproxy.KubeProxyConfiguration, lenientErr, err error) {
	obj, gvk, err := strict.Decode(data, nil, nil)
	if runtime.IsStrictDecodingError(err) {
		lenientErr = err
		obj, gvk, err = lenient.Decode(data, nil, nil)
		if err != nil {
			// As upstream, the strict error says more.
			return nil, nil, fmt.Errorf("decoding leniently after %w", lenientErr)
		}
	}
	want := kubeproxy.SchemeGroupVersion.WithKind("KubeProxyConfiguration")
	switch {
	case runtime.IsNotRegisteredError(err) || runtime.IsMissingKind(err) || runtime.IsMissingVersion(err):
		return nil, nil, fmt.Errorf("want apiVersion %s and kind %s: %w", want.GroupVersion(), want.Kind, err)
	case err != nil:
		return nil, nil, fmt.Errorf("decoding: %w", err)
	}
	c, ok := obj.(*kubeproxy.KubeProxyConfiguration)
	if !ok || *gvk != want {
		return nil, nil, fmt.Errorf("got %s, want apiVersion %s and kind %s", gvk, want.GroupVersion(), want.Kind)
	}
	return c, lenientErr, nil
}

// Load reads the KubeProxyConfiguration at path and maps it (Decode,
// FromKubeProxy). Errors name the file.
func Load(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the kube-proxy configuration: %w", err)
	}
	cfg, lenientErr, err := Decode(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f, err := FromKubeProxy(cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f.Lenient = lenientErr
	return f, nil
}
