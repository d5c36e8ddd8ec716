package worker

// Following the leader of a highly available group of orchestrators (SPEC
// §11). A worker is given one or more control URLs; a host name that
// resolves to several addresses counts as one URL per address. Each dial
// attempt the core asks for tries them in turn, starting with the one that
// connected last: a standby refuses the upgrade with 503 and LeaderHeader,
// the leader's advertised base URL, which is dialed next (at most
// maxLeaderHops times per attempt); any other failure moves on to the next
// URL. Only when every one failed does the core's backoff apply. The data
// plane follows: it talks to the orchestrator the control plane connected
// to, and a standby's 503 with LeaderHeader sends it to the leader named
// there (a write is sent again with its request id, SPEC §14).

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// LeaderHeader names the header with which a standby orchestrator refuses a
// worker (SPEC §11): the leader's advertised base URL.
const LeaderHeader = "Tether-Leader"

// lookupHost resolves a host name (a variable for a test).
var lookupHost = net.DefaultResolver.LookupHost

// minDialShare is the least time one URL is given within a dial attempt.
const minDialShare = time.Second

// maxLeaderHops bounds how many standbys' pointers one dial attempt follows.
const maxLeaderHops = 3

// target is one place to dial: a control URL, and the address to connect
// to for it when its host name resolved to several ("" to resolve it).
type target struct {
	url  string
	addr string
}

// dialAddr is the address to connect to in place of addr.
func (t target) dialAddr(addr string) string {
	if t.addr != "" {
		return t.addr
	}
	return addr
}

// ControlURLFor turns a leader's advertised base URL (http://HOST:PORT, as
// LeaderHeader carries it) into its control plane's URL.
func ControlURLFor(base string) (string, error) {
	u, err := url.Parse(strings.TrimSpace(base))
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("worker: leader URL %q: want http://HOST:PORT", base)
	}
	switch strings.ToLower(u.Scheme) {
	case "http", "ws":
		u.Scheme = "ws"
	case "https", "wss":
		u.Scheme = "wss"
	default:
		return "", fmt.Errorf("worker: leader URL %q: want http://HOST:PORT", base)
	}
	u.Path, u.RawPath, u.RawQuery, u.Fragment = "/control", "", "", ""
	return u.String(), nil
}

// dialOrder is the URLs in the order to dial: pref, then the others given.
func dialOrder(pref string, urls []string) []string {
	order := []string{pref}
	for _, u := range urls {
		if u != pref {
			order = append(order, u)
		}
	}
	return order
}

// expand returns the targets of a URL: one per address when its host is a
// name that resolves to several, else the URL alone (the dialer resolves it
// and reports what fails).
func expand(ctx context.Context, raw string) []target {
	u, err := url.Parse(raw)
	if err != nil || u.Hostname() == "" || net.ParseIP(u.Hostname()) != nil {
		return []target{{url: raw}}
	}
	addrs, err := lookupHost(ctx, u.Hostname())
	if err != nil || len(addrs) < 2 {
		return []target{{url: raw}}
	}
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "wss" {
			port = "443"
		}
	}
	ts := make([]target, len(addrs))
	for i, a := range addrs {
		ts[i] = target{url: raw, addr: net.JoinHostPort(a, port)}
	}
	return ts
}

// dialAny dials the URLs of order in turn (each expanded), following a
// standby's LeaderHeader, until one connects. Each URL has an equal share
// of the attempt's timeout (at least minDialShare), so that one that never
// answers (its host gone, its packets dropped) cannot keep the others from
// being tried. On failure, next is the URL to dial first next time: the
// leader last named, else the URL after the first, and err says what each
// attempt met.
func (d *Driver) dialAny(ctx context.Context, order []string, timeout time.Duration) dialed {
	var (
		errs []string
		next string
		hops int
	)
	if len(order) > 1 {
		next = order[1]
	}
	share := max(timeout/time.Duration(len(order)), min(minDialShare, timeout))
	for i := 0; i < len(order) && ctx.Err() == nil; i++ {
	targets:
		for _, at := range expand(ctx, order[i]) {
			actx, cancel := context.WithTimeout(ctx, share)
			ws, cc, leader, err := d.dialOne(actx, at, share)
			cancel()
			if err == nil {
				return dialed{ws: ws, cc: cc, at: at}
			}
			errs = append(errs, err.Error())
			if leader == "" || hops >= maxLeaderHops {
				continue
			}
			lu, lerr := ControlURLFor(leader)
			if lerr != nil || lu == order[i] {
				continue
			}
			hops++
			d.log.Info("a standby named the leader; dialing it", "standby", at.url, "leader", lu)
			rest := []string{lu}
			for _, u := range order[i+1:] {
				if u != lu {
					rest = append(rest, u)
				}
			}
			order = append(order[:i+1:i+1], rest...)
			next = lu
			break targets
		}
	}
	if len(errs) == 0 {
		errs = append(errs, fmt.Sprintf("dial: %v", context.Cause(ctx)))
	}
	return dialed{next: next, err: errors.New(strings.Join(errs, "; "))}
}

// setTarget points the data client at the orchestrator the control plane
// connected to (when it follows the control plane).
func (c *DataClient) setTarget(at target) {
	if !c.follow {
		return
	}
	base, err := DataURLFor(at.url)
	if err != nil {
		return
	}
	c.switchTo(base, at.addr)
}

// followLeader points the data client at the leader a standby's 503 names;
// it says whether it did.
func (c *DataClient) followLeader(resp *http.Response) bool {
	leader := resp.Header.Get(LeaderHeader)
	if !c.follow || resp.StatusCode != http.StatusServiceUnavailable || leader == "" {
		return false
	}
	base, err := DataURLFor(leader)
	if err != nil || !c.switchTo(base, "") {
		return false
	}
	if c.onLeader != nil {
		c.onLeader(leader)
	}
	return true
}
