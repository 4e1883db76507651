package dht

import (
	"fmt"
	"math/rand/v2"
)

// Pair is a key and its value: one insert of a workload, or one element
// of a volume (Volume.Contents).
type Pair struct{ Key, Value uint32 }

// Workload returns n inserts with distinct random keys of which the
// fraction collisions (0 to 1) collide: their bucket is the bucket of
// another key of the workload, whatever the order they arrive in (a
// workload of n keys over d distinct buckets has n-d collisions, the
// paper's R_cols). Values are ValueOf(key, seed). The same arguments give
// the same workload on every host, so sources split it with Share and the
// target checks it. Errors: ErrInvalid when the table has fewer than
// n*(1-collisions) buckets or the arguments are out of range.
func Workload(n int, l Layout, collisions float64, seed uint64) ([]Pair, error) {
	if err := l.Check(); err != nil {
		return nil, err
	}
	fresh := n - int(float64(n)*collisions+0.5)
	if n < 1 || collisions < 0 || collisions >= 1 || fresh < 1 || fresh > l.Buckets || n > 1<<30 {
		return nil, fmt.Errorf("%w: %d inserts at %.0f%% collisions into %d buckets", ErrInvalid, n, 100*collisions, l.Buckets)
	}
	if fresh > l.Buckets*9/10 && fresh > 1 {
		// Rejection sampling needs free buckets to find.
		return nil, fmt.Errorf("%w: %d distinct buckets wanted of %d: make the table larger", ErrInvalid, fresh, l.Buckets)
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	keys := map[uint32]bool{}
	used := map[int]bool{}
	var out []Pair
	coll := n - fresh
	for len(out) < n {
		k := rng.Uint32()
		if k == 0 || keys[k] {
			continue
		}
		b := l.Bucket(k)
		switch {
		case !used[b] && fresh > 0:
			fresh--
			used[b] = true
		case used[b] && coll > 0:
			coll--
		default:
			continue
		}
		keys[k] = true
		out = append(out, Pair{k, ValueOf(k, seed)})
	}
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out, nil
}

// ValueOf is the value Workload gives key with seed (never 0). It cannot
// fail.
func ValueOf(key uint32, seed uint64) uint32 {
	x := uint64(key)*0xff51afd7ed558ccd ^ seed
	x ^= x >> 33
	return uint32(x*0xc4ceb9fe1a85ec53>>32) | 1
}

// Share returns source i's part (0 <= i < k) of a workload: every k-th
// pair from i. It cannot fail: an i or k out of range gives no pairs.
func Share(w []Pair, i, k int) []Pair {
	var out []Pair
	for j := i; j < len(w) && i >= 0 && k > 0; j += k {
		out = append(out, w[j])
	}
	return out
}

// Collisions counts the inserts of w whose bucket another insert of w
// also uses (n minus the distinct buckets), for a layout that passes
// Check. It cannot fail.
func Collisions(w []Pair, l Layout) int {
	used := map[int]bool{}
	for _, p := range w {
		used[l.Bucket(p.Key)] = true
	}
	return len(w) - len(used)
}
