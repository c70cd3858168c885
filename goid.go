package flightlock

import "runtime"

// goid returns the id of the calling goroutine, read from the header line of its stack trace
// ("goroutine 18 [running]:"). Go keeps goroutine identity out of its API on purpose; the lock
// needs it in one place only: to tell a re-entry down one call chain, which must enter at once
// whatever context the chain passed on, from a re-entry by another goroutine that carries the
// holder's context, which must wait its turn (issue 8, finding 3). It costs about a
// microsecond and runs only on re-entry. Goroutine ids are never reused.
func goid() int64 {
	var buf [64]byte
	n := runtime.Stack(buf[:], false)
	const prefix = "goroutine "
	var id int64
	for _, c := range buf[len(prefix):n] {
		if c < '0' || c > '9' {
			break
		}
		id = id*10 + int64(c-'0')
	}
	if id == 0 {
		// 0 would read as "no goroutine" and let every re-entry through: never guess.
		panic("flightlock: cannot read the goroutine id from " + string(buf[:n]))
	}
	return id
}
