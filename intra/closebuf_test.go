package intra

import (
	"context"
	"fmt"
	"testing"
)

// Close unmaps every symmetric buffer of the group: a buffer's Bytes is nil
// after it (as after Free), never a slice over memory no longer mapped,
// whose first touch would crash the process; Free after Close is harmless.
func TestBufferBytesNilAfterClose(t *testing.T) {
	errs := group(t, 2, Config{}, func(g *Group) error {
		b, err := g.Alloc(context.Background(), 4096)
		if err != nil {
			return err
		}
		if len(b.Bytes()) != 4096 {
			return fmt.Errorf("Bytes holds %d bytes, want 4096", len(b.Bytes()))
		}
		if err := g.Close(); err != nil {
			return err
		}
		if got := b.Bytes(); got != nil {
			return fmt.Errorf("Bytes after Close: %d bytes over unmapped memory, want nil", len(got))
		}
		if fd, _ := b.File(); fd != -1 {
			return fmt.Errorf("File after Close: fd %d, want -1", fd)
		}
		return b.Free()
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}
