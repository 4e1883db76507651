package service

import (
	"errors"
	"fmt"
	"testing"
)

func TestCountErrors(t *testing.T) {
	a, b := errors.New("a"), errors.New("b")
	cases := []struct {
		err  error
		want int
	}{
		{nil, 0},
		{a, 1},
		{errors.Join(a, b), 2},
		{errors.Join(a, errors.Join(a, b)), 3},
		{fmt.Errorf("wrapped: %w", errors.Join(a, b)), 1},
	}
	for _, c := range cases {
		if got := countErrors(c.err); got != c.want {
			t.Errorf("countErrors(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}
