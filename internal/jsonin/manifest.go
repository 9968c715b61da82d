package jsonin

import "github.com/delegate-dev/delegate"

// DecodeManifest decodes a manifest strictly (an unknown field or a
// duplicate key is an error, so that a typo never turns into a silent
// default), without validating its values.
func DecodeManifest(data []byte) (delegate.Manifest, error) {
	var m delegate.Manifest
	if err := Decode(data, &m, "manifest"); err != nil {
		return delegate.Manifest{}, err
	}
	return m, nil
}

// ParseManifest decodes a manifest strictly and validates it.
func ParseManifest(data []byte) (delegate.Manifest, error) {
	m, err := DecodeManifest(data)
	if err != nil {
		return delegate.Manifest{}, err
	}
	return m, m.Validate()
}
