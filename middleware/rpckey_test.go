package middleware

import (
	"context"
	"net/http/httptest"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"
)

// A rule that locks a REST route and a zrpc method with one template locks one entity through
// both: a bool that the REST handler binds from "1", "true" or "TRUE" renders the key that the
// same bool renders in a zrpc request message (true and false alike: a oneof field has
// presence, so false is a value, not a missing field).
func TestRPCBoolRendersTheRESTKey(t *testing.T) {
	keys, err := parseTemplate("coupon:{bool_value}")
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
		restKeys, err := templateHTTPKeys(restPlan)(r)
		if err != nil {
			t.Fatal(err)
		}
		rpcKeys, err := templateRPCKeys(rpcPlan)(context.Background(), structpb.NewBoolValue(tc.value))
		if err != nil {
			t.Fatal(err)
		}
		if restKeys[0] != rpcKeys[0] {
			t.Errorf("REST ?bool_value=%s renders %q, zrpc %v renders %q: one bool, two keys", tc.query, restKeys[0], tc.value, rpcKeys[0])
		}
	}
}
