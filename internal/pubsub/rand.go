package pubsub

import "math/rand/v2"

// defaultRand is the jitter source when Options.Rand is nil.
func defaultRand() float64 { return rand.Float64() }
