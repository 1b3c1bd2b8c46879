package bench

import (
	"context"
	"time"

	"github.com/slimego/slimego/collective"
	"github.com/slimego/slimego/device"
)

// EmulatedBackend is the backend column of figures measured on the
// emulated CUDA library (libslimecuda-emu.so: host threads, no GPU). They
// say whether the GPU path is right, and nothing of a GPU's speed: the
// tables that hold them say "emulated", and no report treats them as a
// GPU's figures.
const EmulatedBackend = "cuda-emu"

// BackendName is the backend column for c's figures: "cpu", "cuda", or
// EmulatedBackend where the CUDA library is the emulator.
func BackendName(c *collective.Communicator) string {
	if c.Device().Kind() == device.CUDA && device.CUDAEmulated() {
		return EmulatedBackend
	}
	return c.Backend().String()
}

// EmulatedNote is the line a table of emulated figures carries under its
// title.
const EmulatedNote = "EMULATED: the CUDA library is libslimecuda-emu.so (host threads, no GPU); these figures check the GPU path and measure no GPU"

// D2DBackend is the backend column of gpu's copy figures: "cuda", or
// EmulatedBackend.
func D2DBackend(gpu *device.GPU) string {
	if gpu.Emulated() {
		return EmulatedBackend
	}
	return "cuda"
}

// D2D measures a device-to-device copy of n bytes on gpu, the ceiling of
// the GPU all-gather: the mean over enough back-to-back copies to fill
// minTime, timed with CUDA events. gbps counts the bytes copied (not read
// plus written), as busbw counts the bytes a rank receives.
func D2D(ctx context.Context, gpu *device.GPU, n int, minTime time.Duration) (us, gbps float64, err error) {
	a, err := gpu.Alloc(n)
	if err != nil {
		return 0, 0, err
	}
	defer a.Free()
	b, err := gpu.Alloc(n)
	if err != nil {
		return 0, 0, err
	}
	defer b.Free()
	s, err := gpu.NewCUDAStream()
	if err != nil {
		return 0, 0, err
	}
	defer s.Close()
	start, err := gpu.NewCUDAEvent(true)
	if err != nil {
		return 0, 0, err
	}
	defer start.Close()
	end, err := gpu.NewCUDAEvent(true)
	if err != nil {
		return 0, 0, err
	}
	defer end.Close()
	copies := func(k int) (time.Duration, error) {
		if err := start.Record(s); err != nil {
			return 0, err
		}
		for range k {
			if err := gpu.Copy(s, b, a); err != nil {
				return 0, err
			}
		}
		if err := end.Record(s); err != nil {
			return 0, err
		}
		if err := s.Synchronize(ctx); err != nil {
			return 0, err
		}
		return end.Since(start)
	}
	k := 1
	for {
		d, err := copies(k)
		if err != nil {
			return 0, 0, err
		}
		if d >= minTime || k >= 1<<20 {
			us = d.Seconds() * 1e6 / float64(k)
			return us, float64(n) / (us * 1e-6) / 1e9, nil
		}
		k *= 4
	}
}
