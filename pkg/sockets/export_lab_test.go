//go:build lab

package sockets

// FailQP moves the connection's QP to the error state, as a failing NIC
// or link would (lab tests of the QP-error demote).
func FailQP(c *Conn) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.att == nil || !c.att.connected {
		return ErrNotAttached
	}
	return c.att.qp.ToError()
}
