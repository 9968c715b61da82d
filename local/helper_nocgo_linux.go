//go:build linux && !cgo

package local

// haveCHelper: built without cgo, this binary has only the Go helpers.
const haveCHelper = false
