package lockstore

import (
	"strconv"
	"strings"
	"sync"
)

// FenceKeyPrefix starts the names of the fence counters, one per Redis Cluster hash slot in
// use: "flightlock:fence:{<tag>}", where the tag hashes to the slot.
const FenceKeyPrefix = "flightlock:fence:"

// FenceKey names the counter of the last fence handed out in lock key k's Redis Cluster slot
// (acquire.lua touches both), which the next grant there exceeds; one per slot, so no expiry.
// Built per call, so a process that locked keys of every slot keeps no 16,384 names live.
func FenceKey(k string) string {
	var buf [len(FenceKeyPrefix) + len("{4294967295}")]byte
	b := append(buf[:0], FenceKeyPrefix...)
	b = append(b, '{')
	b = strconv.AppendUint(b, uint64(slotTag(KeySlot(k))), 10)
	b = append(b, '}')
	return string(b)
}

// KeySlot is k's Redis Cluster hash slot: CRC16/XMODEM of its hash tag (or of k) mod 16384.
func KeySlot(k string) uint16 {
	if tag, ok := hashTag(k); ok {
		k = tag
	}
	return crc16(k) % 16384
}

// hashTag is what k's first "{" and the next "}" enclose, if not empty: what Redis Cluster hashes.
func hashTag(k string) (string, bool) {
	_, rest, open := strings.Cut(k, "{")
	tag, _, closed := strings.Cut(rest, "}")
	return tag, open && closed && tag != ""
}

// crc16 is CRC16/XMODEM (polynomial 0x1021, no reflection, initial value 0), table-driven.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^s[i]]
	}
	return crc
}

// crc16Table[b] is the CRC16/XMODEM register after shifting the byte b through it.
var crc16Table = func() (t [256]uint16) {
	for b := range t {
		crc := uint16(b) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[b] = crc
	}
	return t
}()

var (
	slotTagsOnce sync.Once
	// slotTags[s] is 1 + the smallest number whose decimal string hashes to slot s (0: not yet
	// found), read-only once filled. An array: it lives in the binary's data, not in the heap.
	slotTags [16384]uint32
)

// slotTag returns a number whose decimal string has its CRC16 in slot s.
func slotTag(s uint16) uint32 {
	slotTagsOnce.Do(func() {
		var buf [10]byte
		for i, left := uint32(0), len(slotTags); left > 0; i++ {
			slot := crc16(string(strconv.AppendUint(buf[:0], uint64(i), 10))) % 16384
			if slotTags[slot] == 0 {
				slotTags[slot] = i + 1
				left--
			}
		}
	})
	return slotTags[s] - 1
}

// SideKey names a key of a kind a store keeps beside lock key k (read holds, a fair line): under
// FenceKeyPrefix (no lock key can be one), unique per k, in k's Redis Cluster hash slot (one
// script may touch both). A tagged k keeps its tag (the prefix adds no brace before it); any
// other gets its slot's tag and a separator of its own, so as never to equal a tagged key's.
func SideKey(kind, k string) string {
	if _, ok := hashTag(k); ok {
		return FenceKeyPrefix + kind + ":" + k
	}
	// "#", not ":": this side key of "k" must differ from the tagged one of "{<tag>}k".
	return FenceKeyPrefix + kind + "#" + ownSlotTag(k) + k
}

// ownSlotTag is a hash tag, "{<number>}", of k's Redis Cluster hash slot: FenceKey's.
func ownSlotTag(k string) string { return FenceKey(k)[len(FenceKeyPrefix):] }

// PermitKey names permit i (1 <= i <= n) of a semaphore whose first permit is lock key k.
// Permit 1 is k itself; the others are k, "#", a part that keeps them in k's Redis Cluster slot
// (for one script call), and i: "k#i" for a tagged k, "k#{<tag>}i" for a k without "{", and
// "k#i" (slots split) for a k whose "{" opens no tag. A
// caller doubling each "#" of its keys (the Locker) keeps permit keys distinct from all others:
// only they have a lone "#", and the "{" after it, or its absence, says which form it is.
func PermitKey(k string, i int) string {
	if i == 1 {
		return k
	}
	return k + permitSuffix(k) + strconv.Itoa(i)
}

// PermitKeys returns the keys of permits 1 to n of k (PermitKey), working out k's slot once.
func PermitKeys(k string, n int) []string {
	keys := make([]string, n)
	suffix := permitSuffix(k)
	for i := range keys {
		keys[i] = k
		if i > 0 {
			keys[i] = k + suffix + strconv.Itoa(i+1)
		}
	}
	return keys
}

// permitSuffix is what PermitKey puts between k and a permit's number.
func permitSuffix(k string) string {
	if _, tagged := hashTag(k); tagged || strings.Contains(k, "{") {
		return "#"
	}
	return "#" + ownSlotTag(k)
}
