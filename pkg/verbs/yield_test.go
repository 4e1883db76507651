package verbs

import (
	"testing"
	"time"
)

func TestYielderEvery(t *testing.T) {
	var y Yielder
	time.Sleep(YieldEvery) // the zero value counts from package start
	if !y.Maybe() {
		t.Fatal("no yield after YieldEvery")
	}
	if y.Maybe() {
		t.Fatal("yielded again at once")
	}
	time.Sleep(YieldEvery)
	if !y.Maybe() {
		t.Fatal("no yield after another YieldEvery")
	}
}
