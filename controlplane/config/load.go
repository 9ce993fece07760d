package config

import (
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
)

var decoder = newDecoder()

func newDecoder() runtime.Decoder {
	s := runtime.NewScheme()
	s.AddKnownTypes(SchemeGroupVersion, &ControlPlaneConfiguration{})
	return serializer.NewCodecFactory(s, serializer.EnableStrict).UniversalDeserializer()
}

// Decode decodes a ControlPlaneConfiguration in YAML or JSON, strictly:
// an unknown or duplicated field is an error. There is no lenient
// fallback, unlike kube-proxy's, which keeps one for files written for
// older releases: this type has no older release.
func Decode(data []byte) (*ControlPlaneConfiguration, error) {
	want := SchemeGroupVersion.WithKind("ControlPlaneConfiguration")
	obj, gvk, err := decoder.Decode(data, nil, nil)
	switch {
	case runtime.IsNotRegisteredError(err) || runtime.IsMissingKind(err) || runtime.IsMissingVersion(err):
		return nil, fmt.Errorf("want apiVersion %s and kind %s: %w", want.GroupVersion(), want.Kind, err)
	case err != nil:
		return nil, fmt.Errorf("decoding: %w", err)
	}
	c, ok := obj.(*ControlPlaneConfiguration)
	if !ok || *gvk != want {
		return nil, fmt.Errorf("got %s, want apiVersion %s and kind %s", gvk, want.GroupVersion(), want.Kind)
	}
	return c, nil
}

// Load reads and decodes the file at path; errors name it.
func Load(path string) (*ControlPlaneConfiguration, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the control plane configuration: %w", err)
	}
	c, err := Decode(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}
