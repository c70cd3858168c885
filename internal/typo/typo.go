// Package typo finds the name that a misspelt one most probably meant, for the start-up checks
// of the middleware and the checks of the CLI.
package typo

// Edits is how many edits away from name a candidate may be and still be offered as the name
// it misspells: a third of name, at most 3, so that a short or wholly other name is not
// "corrected" into an unrelated one.
func Edits(name string) int {
	return min(3, len(name)/3+1)
}

// Distance is the Levenshtein distance of a and b, in bytes.
func Distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
