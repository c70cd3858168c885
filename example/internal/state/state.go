// Package state keeps the example's stock, balances and orders in Redis, next to the locks.
//
// Every write is fenced: it names the fencing token of the lease that protects the entity
// (flightlock.Lease.Fence) and is applied only if that fence is at least the largest one that
// wrote the entity before, storing it. Stock and balance changes are one call of flightlock's
// fenced package (fenced.HIncrBy); a transfer (two accounts at once) and an order (appended to
// the user's book) keep scripts of their own, written to the same layout (fenced.FieldFence). A holder that stalled past its TTL,
// whose lock went to someone else meanwhile, carries a smaller fence than the new owner's
// writes and is refused with ErrStaleFence, so it cannot undo them.
//
// Keys, after the configured prefix:
//
//	sku:<sku>         hash {stock, lock_fence}           written under the lock "sku:<sku>"
//	{acct}:<account>  hash {balance, lock_fence}         written under the lock "acct:<account>"
//	orders:<uid>      hash {seq, lock_fence, <n>: JSON}  written under the lock "order:<uid>"
//
// Account keys share the hash tag {acct} so that a transfer's one script may touch two of them
// on Redis Cluster.
package state

import (
	"cmp"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/flightlock/flightlock/fenced"
)

var (
	// ErrStaleFence means the write carried a fence smaller than one that already wrote the
	// entity: the writer's lock was taken over, and its write would overwrite a newer one.
	// It is fenced.ErrStaleFence, so callers may test for either.
	ErrStaleFence = fenced.ErrStaleFence
	// ErrNotFound means the SKU or account does not exist.
	ErrNotFound = errors.New("state: not found")
	// ErrInsufficient means the stock or balance is lower than the amount taken off it.
	ErrInsufficient = errors.New("state: insufficient")
	// ErrInvalidID means a SKU, account or user id is not 1 to 64 characters of
	// [A-Za-z0-9_-].
	ErrInvalidID = errors.New("state: invalid id")
)

var (
	//go:embed transfer.lua
	transferLua string
	//go:embed addorder.lua
	addOrderLua string

	transferScript = redis.NewScript(transferLua)
	addOrderScript = redis.NewScript(addOrderLua)
)

// Reply codes of the scripts.
const (
	replyApplied      = 1
	replyStale        = 0
	replyInsufficient = -1
	replyUnknown      = -2
)

// Client is what Store needs from go-redis: scripts and a few hash reads. *redis.Client and
// *redis.ClusterClient implement it.
type Client interface {
	redis.Scripter
	HGet(ctx context.Context, key, field string) *redis.StringCmd
	HGetAll(ctx context.Context, key string) *redis.MapStringStringCmd
	HSetNX(ctx context.Context, key, field string, value any) *redis.BoolCmd
	Pipeline() redis.Pipeliner
}

// Store reads and writes the example's entities. It is safe for concurrent use.
type Store struct {
	rdb    Client
	prefix string
}

// New returns a Store on rdb whose keys start with prefix.
func New(rdb Client, prefix string) *Store {
	return &Store{rdb: rdb, prefix: prefix}
}

// Order is one order of a user.
type Order struct {
	ID     string `json:"id"`
	UID    string `json:"uid"`
	SKU    string `json:"sku"`
	Qty    int64  `json:"qty"`
	Amount int64  `json:"amount"` // cents debited
	Fence  int64  `json:"fence"`  // fence of the order lock it was written under
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// CheckID returns ErrInvalidID, naming what, unless id is 1 to 64 characters of
// [A-Za-z0-9_-]. Ids end up in lock and state keys; a small alphabet keeps both readable.
func CheckID(what, id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("%w: %s %q must be 1 to 64 characters of A-Z a-z 0-9 _ -", ErrInvalidID, what, id)
	}
	return nil
}

func (s *Store) skuKey(sku string) string         { return s.prefix + "sku:" + sku }
func (s *Store) accountKey(account string) string { return s.prefix + "{acct}:" + account }
func (s *Store) ordersKey(uid string) string      { return s.prefix + "orders:" + uid }

// seedBatch is how many HSETNX one pipeline of Seed sends.
const seedBatch = 1000

// Seed creates the SKUs and accounts that do not exist yet with the given stock and balances;
// existing ones keep their values. It pipelines the writes, seedBatch to a round trip.
func (s *Store) Seed(ctx context.Context, stock, balances map[string]int64) error {
	pipe := s.rdb.Pipeline()
	flush := func() error {
		if pipe.Len() == 0 {
			return nil
		}
		_, err := pipe.Exec(ctx)
		return err
	}
	add := func(key, field string, n int64) error {
		pipe.HSetNX(ctx, key, field, n)
		if pipe.Len() < seedBatch {
			return nil
		}
		return flush()
	}
	for sku, n := range stock {
		if err := add(s.skuKey(sku), "stock", n); err != nil {
			return fmt.Errorf("seed stock: %w", err)
		}
	}
	for account, n := range balances {
		if err := add(s.accountKey(account), "balance", n); err != nil {
			return fmt.Errorf("seed balances: %w", err)
		}
	}
	if err := flush(); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	return nil
}

// Stock returns the stock of sku.
func (s *Store) Stock(ctx context.Context, sku string) (int64, error) {
	return s.counter(ctx, s.skuKey(sku), "stock")
}

// Balance returns the balance of account.
func (s *Store) Balance(ctx context.Context, account string) (int64, error) {
	return s.counter(ctx, s.accountKey(account), "balance")
}

// StockFence returns the largest fence that wrote sku's stock, 0 before the first write.
func (s *Store) StockFence(ctx context.Context, sku string) (int64, error) {
	return s.fence(ctx, s.skuKey(sku))
}

// AccountFence returns the largest fence that wrote account's balance, 0 before the first
// write.
func (s *Store) AccountFence(ctx context.Context, account string) (int64, error) {
	return s.fence(ctx, s.accountKey(account))
}

func (s *Store) counter(ctx context.Context, key, field string) (int64, error) {
	v, err := s.rdb.HGet(ctx, key, field).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, ErrNotFound
	}
	return v, err
}

func (s *Store) fence(ctx context.Context, key string) (int64, error) {
	return fenced.Fence(ctx, s.rdb, key)
}

// AdjustStock adds delta (negative: takes off) to the stock of sku, fenced by fence, and
// returns the new stock. Errors: ErrStaleFence, ErrInsufficient, ErrNotFound.
func (s *Store) AdjustStock(ctx context.Context, sku string, delta, fence int64) (int64, error) {
	return s.adjust(ctx, s.skuKey(sku), "stock", delta, fence)
}

// AdjustBalance adds delta (negative: takes off) to the balance of account, fenced by fence,
// and returns the new balance. Errors: ErrStaleFence, ErrInsufficient, ErrNotFound.
func (s *Store) AdjustBalance(ctx context.Context, account string, delta, fence int64) (int64, error) {
	return s.adjust(ctx, s.accountKey(account), "balance", delta, fence)
}

func (s *Store) adjust(ctx context.Context, key, field string, delta, fence int64) (int64, error) {
	v, err := fenced.HIncrBy(ctx, s.rdb, key, field, delta, fence, fenced.AtLeast(0), fenced.Existing())
	switch {
	case errors.Is(err, fenced.ErrBelowFloor):
		return v, fmt.Errorf("%w: %s has %s %d, asked to add %d", ErrInsufficient, key, field, v, delta)
	case errors.Is(err, fenced.ErrMissing):
		return 0, fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	return v, err
}

// Transfer moves amount from one account to the other, all or nothing, each write fenced by
// the fence of its account's lease, and returns both new balances. Errors: ErrStaleFence,
// ErrInsufficient (the from account lacks funds), ErrNotFound.
func (s *Store) Transfer(ctx context.Context, from, to string, amount, fromFence, toFence int64) (int64, int64, error) {
	keys := []string{s.accountKey(from), s.accountKey(to)}
	reply, err := transferScript.Run(ctx, s.rdb, keys, amount, fromFence, toFence).Int64Slice()
	if err != nil {
		return 0, 0, fmt.Errorf("transfer %s -> %s: %w", from, to, err)
	}
	if len(reply) != 3 {
		return 0, 0, fmt.Errorf("transfer %s -> %s: unexpected reply %v", from, to, reply)
	}
	switch reply[0] {
	case replyApplied:
		return reply[1], reply[2], nil
	case replyStale:
		if i := reply[1]; i == 1 || i == 2 {
			return 0, 0, fmt.Errorf("%w: %s was written with fence %d", ErrStaleFence, keys[i-1], reply[2])
		}
	case replyInsufficient:
		return 0, 0, fmt.Errorf("%w: %s has balance %d, asked to transfer %d", ErrInsufficient, from, reply[1], amount)
	case replyUnknown:
		if i := reply[1]; i == 1 || i == 2 {
			return 0, 0, fmt.Errorf("%w: %s", ErrNotFound, keys[i-1])
		}
	}
	return 0, 0, fmt.Errorf("transfer %s -> %s: unexpected reply %v", from, to, reply)
}

// AddOrder stores o in its user's order book, fenced by o.Fence, and returns it with its ID
// set. Errors: ErrStaleFence.
func (s *Store) AddOrder(ctx context.Context, o Order) (Order, error) {
	o.ID = ""
	body, err := json.Marshal(o)
	if err != nil {
		return Order{}, err
	}
	key := s.ordersKey(o.UID)
	reply, err := addOrderScript.Run(ctx, s.rdb, []string{key}, o.Fence, body).Int64Slice()
	if err != nil {
		return Order{}, fmt.Errorf("add order for %s: %w", o.UID, err)
	}
	if len(reply) != 2 {
		return Order{}, fmt.Errorf("add order for %s: unexpected reply %v", o.UID, reply)
	}
	switch reply[0] {
	case replyApplied:
		o.ID = orderID(o.UID, reply[1])
		return o, nil
	case replyStale:
		return Order{}, fmt.Errorf("%w: %s was written with fence %d, this write has %d", ErrStaleFence, key, reply[1], o.Fence)
	}
	return Order{}, fmt.Errorf("add order for %s: unexpected reply %v", o.UID, reply)
}

// Orders returns the orders of uid, oldest first.
func (s *Store) Orders(ctx context.Context, uid string) ([]Order, error) {
	fields, err := s.rdb.HGetAll(ctx, s.ordersKey(uid)).Result()
	if err != nil {
		return nil, err
	}
	type numbered struct {
		n int64
		o Order
	}
	book := make([]numbered, 0, len(fields))
	for field, body := range fields {
		n, err := strconv.ParseInt(field, 10, 64)
		if err != nil {
			continue // "seq" and fenced.FieldFence
		}
		var o Order
		if err := json.Unmarshal([]byte(body), &o); err != nil {
			return nil, fmt.Errorf("order %d of %s: %w", n, uid, err)
		}
		o.ID = orderID(uid, n)
		book = append(book, numbered{n: n, o: o})
	}
	slices.SortFunc(book, func(a, b numbered) int { return cmp.Compare(a.n, b.n) })
	orders := make([]Order, len(book))
	for i, b := range book {
		orders[i] = b.o
	}
	return orders, nil
}

func orderID(uid string, n int64) string { return uid + "-" + strconv.FormatInt(n, 10) }
