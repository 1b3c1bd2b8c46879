package p2p

import (
	"errors"
	"testing"
	"time"
)

// TestRegisterErrorsNameRegion: Register's errors name the region in
// OpError.Region as every other error of the package does (quoted:
// `"kv"`, TestRefusalNamesRegion), so that a program that matches on
// the field finds the name the same way whatever call failed.
func TestRegisterErrorsNameRegion(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	a := endpoint(t, ctx, Options{Name: "a", Auth: testAuth()})
	if _, err := a.Register("kv", make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		what, name string
		mem        any
		want       error
	}{
		{"a name registered", "kv", make([]byte, 8), ErrInvalid},
		{"no bytes", "empty", []byte{}, ErrInvalid},
		{"memory of another type", "str", "a string", ErrInvalid},
		{"a nil *Shared", "nil", (*Shared)(nil), ErrInvalid},
	} {
		_, err := a.Register(tc.name, tc.mem)
		var oe *OpError
		if !errors.Is(err, tc.want) || !errors.As(err, &oe) || oe.Op != "register" || oe.Region != `"`+tc.name+`"` {
			t.Errorf("%s: %v (Region %s); want %v of register, Region %q", tc.what, err, func() string {
				if oe == nil {
					return "none"
				}
				return "`" + oe.Region + "`"
			}(), tc.want, `"`+tc.name+`"`)
		}
	}
	a.Close()
	_, err := a.Register("late", make([]byte, 8))
	var oe *OpError
	if !errors.Is(err, ErrClosed) || !errors.As(err, &oe) || oe.Region != `"late"` {
		t.Errorf("Register after Close: %v; want ErrClosed, Region %q", err, `"late"`)
	}
}
