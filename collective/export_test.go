package collective

// Test hooks, compiled into the package's tests only.

// ForceNoP2P makes Init find that the node's GPUs cannot reach each
// other, so that plans of device memory take the host-staged engine (or,
// under the ring across nodes, the ring without the LL group). Set it
// only while no communicator is being made; it returns the undo.
func ForceNoP2P() (undo func()) {
	noP2P.Store(true)
	return func() { noP2P.Store(false) }
}

// Capturable says whether p's launches only enqueue kernels on the
// communicator's stream (and so can be captured into a CUDA graph).
func Capturable(p *Plan) bool {
	g, ok := p.eng.(*gpuPlan)
	return ok && g.op.capturable()
}

// Captured says whether p is a plan of kernels whose CUDA graph exists
// (graph mode, once captured).
func Captured(p *Plan) bool {
	g, ok := p.eng.(*gpuPlan)
	if !ok {
		return false
	}
	k, ok := g.op.(*kernelPlanned)
	return ok && k.runner.Captured()
}

// InCall says whether a goroutine is in a call on c (one that enter let
// in and that has not left).
func InCall(c *Communicator) bool { return c.busy.Load() == inCall }
