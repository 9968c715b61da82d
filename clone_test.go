package delegate_test

import (
	"reflect"
	"testing"

	"github.com/delegate-dev/delegate"
)

// TestJobClone: a clone of a job whose every field is set shares no map,
// slice or pointed-to value with it, and is equal to it. A reference
// field added to Job or Manifest (or to what they point to) that Clone
// does not copy fails this test.
func TestJobClone(t *testing.T) {
	var j delegate.Job
	fill(reflect.ValueOf(&j).Elem())
	c := j.Clone()
	if !reflect.DeepEqual(&j, c) {
		t.Fatalf("clone differs:\n%+v\n%+v", j, *c)
	}
	shared(t, "Job", reflect.ValueOf(j), reflect.ValueOf(*c))
}

// fill sets every field of v (recursively) to a value that is not zero.
func fill(v reflect.Value) {
	switch v.Kind() {
	case reflect.String:
		v.SetString("x")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(1)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(1)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		fill(p.Elem())
		v.Set(p)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		fill(s.Index(0))
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k)
		fill(e)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.Struct:
		if v.Type().PkgPath() == "time" {
			return // a value, nothing shared
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i))
			}
		}
	}
}

// shared fails the test for each map, slice or pointer of a that b holds
// too.
func shared(t *testing.T, path string, a, b reflect.Value) {
	t.Helper()
	switch a.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Map:
		if !a.IsNil() && a.Pointer() == b.Pointer() {
			t.Errorf("%s is shared by the clone", path)
			return
		}
		switch a.Kind() {
		case reflect.Pointer:
			if !a.IsNil() {
				shared(t, path, a.Elem(), b.Elem())
			}
		case reflect.Slice:
			for i := range min(a.Len(), b.Len()) {
				shared(t, path+"[]", a.Index(i), b.Index(i))
			}
		}
	case reflect.Struct:
		for i := range a.NumField() {
			if a.Type().Field(i).IsExported() {
				shared(t, path+"."+a.Type().Field(i).Name, a.Field(i), b.Field(i))
			}
		}
	}
}
