// Package mapshrink gives back the memory of a map that emptied out. Go maps never shrink: a
// map that once held 100,000 keys keeps their buckets after they are gone (the gate's map kept
// 60 B per released lock, the etcd store's table of held locks 79 B). The root package's gate
// and the etcd store keep the peak of their maps and rebuild them with Shrink.
package mapshrink

import "maps"

// Min is the peak below which a map is never rebuilt: a small one costs little whatever it held.
const Min = 256

// Shrink returns m, or a copy sized for what it holds once that is a quarter of peak or less,
// and the peak to keep from then on. The copy costs one step per entry left, paid for by the
// three times as many deletions since the peak. The caller holds whatever guards m.
func Shrink[K comparable, V any](m map[K]V, peak int) (map[K]V, int) {
	n := len(m)
	if peak < Min || n > peak/4 {
		return m, peak
	}
	c := make(map[K]V, n)
	maps.Copy(c, m)
	return c, n
}
