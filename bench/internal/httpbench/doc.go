// Package httpbench is what the HTTP scenarios of lockbench share, on every store:
// the example system (example/app) started in the benchmark process on free loopback ports
// and loaded with wrk (order.lua); a plain go-zero middleware around another library's lock,
// for the rows that replace the example's own; and the server and bursts of the duplicates
// scenario (one request sent many times at once, OnBusy share against reject).
package httpbench
