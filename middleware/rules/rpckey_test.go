package rules

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/flightlock/flightlock"
)

// A rule that locks a REST route and a zrpc method with one template locks one entity through
// both: a bool that the REST handler binds from "1", "true" or "TRUE" renders the key that the
// same bool renders in a zrpc request message (true and false alike: a oneof field has
// presence, so false is a value, not a missing field).
func TestRPCBoolRendersTheRESTKey(t *testing.T) {
	keys, err := TemplateKeys("coupon:{bool_value}")
	if err != nil {
		t.Fatal(err)
	}
	restPlan, err := bindPlan(keys, bindHTTP(nil))
	if err != nil {
		t.Fatal(err)
	}
	rpcPlan, err := bindPlan(keys, bindRPC(nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		query string
		value bool
	}{{"1", true}, {"true", true}, {"TRUE", true}, {"0", false}, {"false", false}, {"False", false}} {
		r := httptest.NewRequest("POST", "/coupon?bool_value="+tc.query, nil)
		restKeys, err := restPlan(&httpSource{r: r})
		if err != nil {
			t.Fatal(err)
		}
		rpcKeys, err := rpcPlan(rpcSource{ctx: context.Background(), req: structpb.NewBoolValue(tc.value)})
		if err != nil {
			t.Fatal(err)
		}
		if restKeys[0] != rpcKeys[0] {
			t.Errorf("REST ?bool_value=%s renders %q, zrpc %v renders %q: one bool, two keys", tc.query, restKeys[0], tc.value, rpcKeys[0])
		}
	}
}

// A zrpc rule keeps out of the middleware's own keys as a REST rule does: a key computed in Go
// (RPCKeyFunc) or rendered from the message is refused with InvalidArgument when it starts
// with "replay:" or "shadow:".
func TestRPCKeysStayOutOfInternalKeys(t *testing.T) {
	for _, k := range []string{"replay:pay:u1", "shadow:x"} {
		rl, err := compileRPC(Spec{Rule: Rule{RPC: "/pkg.Svc/Method"}, Field: "WithRPCRule",
			RPCKey: func(context.Context, any) (string, error) { return k, nil }})
		if err != nil {
			t.Fatal(err)
		}
		if keys, err := rl.RPCKeys(context.Background(), nil); !errors.Is(err, flightlock.ErrInvalidKey) {
			t.Errorf("an RPCKeyFunc's key %q: %q, %v; want ErrInvalidKey", k, keys, err)
		}
	}
	rl, err := compileRPC(Spec{Rule: Rule{RPC: "/pkg.Svc/Method", Key: "{string_value}:x"}, Field: "Lock.Rules[0]"})
	if err != nil {
		t.Fatal(err)
	}
	if keys, err := rl.RPCKeys(context.Background(), structpb.NewStringValue("replay")); !errors.Is(err, flightlock.ErrInvalidKey) {
		t.Errorf("a message field that starts the key with replay: %q, %v; want ErrInvalidKey", keys, err)
	}
	if _, err := compileRPC(Spec{Rule: Rule{RPC: "/pkg.Svc/Method", Key: "replay:{string_value}"}, Field: "Lock.Rules[0]"}); !errors.Is(err, flightlock.ErrConfig) {
		t.Errorf("a template among the stored responses: %v, want ErrConfig", err)
	}
}

// A metadata key sent with two values is ambiguous, as a REST header is: the request is
// refused with ErrInvalidKey naming the metadata once, never the values; one value sent twice
// and empty values are no ambiguity.
func TestRPCMetadataWithSeveralValuesIsInvalidKey(t *testing.T) {
	rl, err := compileRPC(Spec{Rule: Rule{RPC: "/pkg.Svc/Method", Key: "acct:{header.x-account}"}, Field: "Lock.Rules[0]"})
	if err != nil {
		t.Fatal(err)
	}
	ask := func(vals ...string) ([]string, error) {
		md := metadata.MD{}
		md.Append("x-account", vals...)
		return rl.RPCKeys(metadata.NewIncomingContext(context.Background(), md), nil)
	}
	_, err = ask("a1", "a2")
	if !errors.Is(err, flightlock.ErrInvalidKey) || !strings.Contains(err.Error(), "the metadata has several values") || strings.Contains(err.Error(), "a2") {
		t.Fatalf("two values of one metadata key: %v, want ErrInvalidKey saying the metadata has several values, without them", err)
	}
	if keys, err := ask("a1", "", "a1"); err != nil || len(keys) != 1 || keys[0] != "acct:a1" {
		t.Fatalf("one value sent twice beside an empty one: %q, %v; want acct:a1", keys, err)
	}
}
