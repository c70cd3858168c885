package lockstore

import (
	"strconv"
	"strings"
	"sync"
)

// fenceKey names the key that keeps the last fence of lock key k. Both keys must live in one
// Redis Cluster hash slot, since one script touches both:
//   - k has a hash tag ("{user:7}:order"): the fence key reuses it, k + ":fence";
//   - k has no '}' at all: wrapping k whole as the tag gives the slot of k, "{k}:fence";
//   - otherwise (a '}' without a valid tag, e.g. binary keys) the tag is a short string that
//     is known to hash to k's slot, from a table built once.
func fenceKey(k string) string {
	if hasHashTag(k) {
		return k + ":fence"
	}
	if !strings.Contains(k, "}") {
		return "{" + k + "}:fence"
	}
	return "{" + slotTag(keySlot(k)) + "}:fence:" + k
}

// hasHashTag reports whether k has a non-empty {...} section that Redis Cluster hashes instead
// of the whole key.
func hasHashTag(k string) bool {
	open := strings.IndexByte(k, '{')
	if open < 0 {
		return false
	}
	end := strings.IndexByte(k[open+1:], '}')
	return end > 0
}

// keySlot is Redis Cluster's slot of k: CRC16/XMODEM of the key (or its hash tag) mod 16384.
func keySlot(k string) uint16 {
	if open := strings.IndexByte(k, '{'); open >= 0 {
		if end := strings.IndexByte(k[open+1:], '}'); end > 0 {
			k = k[open+1 : open+1+end]
		}
	}
	return crc16(k) % 16384
}

func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

var (
	slotTagsOnce sync.Once
	slotTags     []string // slotTags[s] hashes to slot s; filled once, read-only afterwards
)

// slotTag returns a short decimal string whose CRC16 falls in slot s.
func slotTag(s uint16) string {
	slotTagsOnce.Do(func() {
		slotTags = make([]string, 16384)
		left := len(slotTags)
		for i := 0; left > 0; i++ {
			tag := strconv.Itoa(i)
			if slot := crc16(tag) % 16384; slotTags[slot] == "" {
				slotTags[slot] = tag
				left--
			}
		}
	})
	return slotTags[s]
}
