package loadgen

import (
	"math"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
)

// idSource draws the ids substituted for "{id}". Implementations are safe
// for concurrent use: each caller passes its own *rand.Rand.
type idSource interface {
	// appendID appends the next id to dst.
	appendID(dst []byte, rng *rand.Rand) []byte
}

func newIDSource(ic IDConfig, runID string) idSource {
	switch ic.Dist {
	case DistZipf:
		return &zipfIDs{prefix: ic.Prefix, z: newZipf(uint64(ic.Keys), ic.ZipfS)}
	case DistNew:
		return &newIDs{prefix: ic.Prefix + runID + "-"}
	default:
		return &uniformIDs{prefix: ic.Prefix, n: uint64(ic.Keys)}
	}
}

// uniformIDs draws "<prefix><k>" with k uniform in [0, n).
type uniformIDs struct {
	prefix string
	n      uint64
}

func (u *uniformIDs) appendID(dst []byte, rng *rand.Rand) []byte {
	dst = append(dst, u.prefix...)
	return strconv.AppendUint(dst, rng.Uint64N(u.n), 10)
}

// zipfIDs draws "<prefix><k>" where k+1 is Zipf-distributed over [1, n]:
// id k is the (k+1)-th most popular.
type zipfIDs struct {
	prefix string
	z      *zipf
}

func (z *zipfIDs) appendID(dst []byte, rng *rand.Rand) []byte {
	dst = append(dst, z.prefix...)
	return strconv.AppendUint(dst, z.z.sample(rng)-1, 10)
}

// newIDs hands out "<prefix><runID>-<n>" with n counting up from 0 across
// all workers, so no id repeats within a run.
type newIDs struct {
	prefix string
	next   atomic.Uint64
}

func (n *newIDs) appendID(dst []byte, _ *rand.Rand) []byte {
	dst = append(dst, n.prefix...)
	return strconv.AppendUint(dst, n.next.Add(1)-1, 10)
}

// zipf samples k in [1, n] with P(k) ∝ k^-s for any s > 0, by rejection
// inversion (W. Hörmann and G. Derflinger, "Rejection-inversion to generate
// variates from monotone discrete distributions", ACM TOMACS 6(3), 1996),
// following Apache Commons' RejectionInversionZipfSampler. math/rand/v2's
// Zipf uses the same method but only accepts s > 1, which excludes the
// commonly used s ≈ 0.99 (YCSB). O(1) time and memory per sample whatever n.
// A zipf is immutable; sample is safe for concurrent use with distinct rngs.
type zipf struct {
	n                    float64
	s                    float64
	hIntegralX1          float64
	hIntegralNumElements float64
	sVal                 float64
}

func newZipf(n uint64, s float64) *zipf {
	z := &zipf{n: float64(n), s: s}
	z.hIntegralX1 = z.hIntegral(1.5) - 1
	z.hIntegralNumElements = z.hIntegral(z.n + 0.5)
	z.sVal = 2 - z.hIntegralInverse(z.hIntegral(2.5)-z.h(2))
	return z
}

func (z *zipf) sample(rng *rand.Rand) uint64 {
	for {
		u := z.hIntegralNumElements + rng.Float64()*(z.hIntegralX1-z.hIntegralNumElements)
		x := z.hIntegralInverse(u)
		k := math.Floor(x + 0.5)
		if k < 1 {
			k = 1
		} else if k > z.n {
			k = z.n
		}
		if k-x <= z.sVal || u >= z.hIntegral(k+0.5)-z.h(k) {
			return uint64(k)
		}
	}
}

// h is the unnormalised density x^-s.
func (z *zipf) h(x float64) float64 { return math.Exp(-z.s * math.Log(x)) }

// hIntegral is an antiderivative of h: (x^(1-s) - 1) / (1-s), or log x when s = 1.
func (z *zipf) hIntegral(x float64) float64 {
	logX := math.Log(x)
	return helper2((1-z.s)*logX) * logX
}

// hIntegralInverse inverts hIntegral.
func (z *zipf) hIntegralInverse(x float64) float64 {
	t := x * (1 - z.s)
	if t < -1 {
		t = -1 // numerical noise only; the exact value never goes below -1
	}
	return math.Exp(helper1(t) * x)
}

// helper1 is log1p(x)/x, continuous at 0.
func helper1(x float64) float64 {
	if math.Abs(x) > 1e-8 {
		return math.Log1p(x) / x
	}
	return 1 - x*(0.5-x*(1.0/3-0.25*x))
}

// helper2 is expm1(x)/x, continuous at 0.
func helper2(x float64) float64 {
	if math.Abs(x) > 1e-8 {
		return math.Expm1(x) / x
	}
	return 1 + x*0.5*(1+x*(1.0/3)*(1+0.25*x))
}
