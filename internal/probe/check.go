package probe

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// Check is one thing to try from a pod.
type Check struct {
	Kind string `json:"kind"` // dns, tcp or udp
	// Name and Type: a fully qualified name and A, AAAA, SRV or TXT.
	Name string `json:"name,omitempty"`
	Type string `json:"type,omitempty"`
	// Addr is where tcp and udp dial (ip:port), Tries how many times:
	// each attempt is made (a virtual IP spreads them over clusters).
	Addr  string `json:"addr,omitempty"`
	Tries int    `json:"tries,omitempty"`
}

// Result is what one check found.
type Result struct {
	// Answers: a lookup's records (an address, or "port target" for
	// SRV), sorted; a dial's answering clusters, each once, sorted.
	Answers []string `json:"answers,omitempty"`
	// Failed attempts, the class and text of the last failure.
	Failed int    `json:"failed,omitempty"`
	Class  string `json:"class,omitempty"`
	Error  string `json:"error,omitempty"`
}

// Servers are the name servers of a resolv.conf (a pod's /etc/resolv.conf).
func Servers(resolvConf string) ([]string, error) {
	cfg, err := dns.ClientConfigFromFile(resolvConf)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, s := range cfg.Servers {
		out = append(out, net.JoinHostPort(s, cfg.Port))
	}
	return out, nil
}

// Run makes every check at once, each attempt within timeout, asking the
// first of servers (host:port) for names.
func Run(ctx context.Context, checks []Check, servers []string, timeout time.Duration) []Result {
	out := make([]Result, len(checks))
	var wg sync.WaitGroup
	for i, c := range checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch c.Kind {
			case "dns":
				out[i] = lookup(servers, c, timeout)
			case "tcp", "udp":
				out[i] = dialAll(ctx, c, timeout)
			default:
				out[i] = Result{Failed: 1, Class: NoAnswer, Error: fmt.Sprintf("unknown check kind %q", c.Kind)}
			}
		}()
	}
	wg.Wait()
	return out
}

func lookup(servers []string, c Check, timeout time.Duration) Result {
	qtype, ok := dns.StringToType[c.Type]
	if !ok || len(servers) == 0 {
		return Result{Failed: 1, Class: DNSError, Error: fmt.Sprintf("type %q, servers %v", c.Type, servers)}
	}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(c.Name), qtype)
	m.SetEdns0(1232, false)
	cl := &dns.Client{Timeout: timeout}
	in, _, err := cl.Exchange(m, servers[0])
	if err == nil && in.Truncated {
		cl.Net = "tcp"
		in, _, err = cl.Exchange(m, servers[0])
	}
	switch {
	case err != nil:
		return Result{Failed: 1, Class: DNSError, Error: fmt.Sprintf("asking %s: %v", servers[0], err)}
	case in.Rcode == dns.RcodeNameError:
		return Result{Failed: 1, Class: NXDomain, Error: c.Name + ": no such name"}
	case in.Rcode != dns.RcodeSuccess:
		return Result{Failed: 1, Class: DNSError, Error: fmt.Sprintf("%s: %s from %s", c.Name, dns.RcodeToString[in.Rcode], servers[0])}
	}
	var r Result
	for _, rr := range in.Answer {
		switch rr := rr.(type) {
		case *dns.A:
			r.Answers = append(r.Answers, rr.A.String())
		case *dns.AAAA:
			r.Answers = append(r.Answers, rr.AAAA.String())
		case *dns.TXT:
			r.Answers = append(r.Answers, strings.Join(rr.Txt, " "))
		case *dns.SRV:
			r.Answers = append(r.Answers, fmt.Sprintf("%d %s", rr.Port, rr.Target))
		}
	}
	if len(r.Answers) == 0 {
		return Result{Failed: 1, Class: NoData, Error: fmt.Sprintf("%s: no %s records", c.Name, c.Type)}
	}
	slices.Sort(r.Answers)
	return r
}

func dialAll(ctx context.Context, c Check, timeout time.Duration) Result {
	var r Result
	seen := map[string]bool{}
	for range max(c.Tries, 1) {
		cluster, err := dial(ctx, c.Kind, c.Addr, timeout)
		if err != nil {
			r.Failed++
			r.Class, r.Error = Classify(err), err.Error()
			continue
		}
		seen[cluster] = true
	}
	for cl := range seen {
		r.Answers = append(r.Answers, cl)
	}
	slices.Sort(r.Answers)
	return r
}

// dial sends a line to addr and returns the cluster of the answer.
func dial(ctx context.Context, proto, addr string, timeout time.Duration) (string, error) {
	d := net.Dialer{Timeout: timeout}
	conn, err := d.DialContext(ctx, proto, addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if _, err := conn.Write([]byte("verify\n")); err != nil {
		return "", err
	}
	var line string
	if proto == "udp" {
		buf := make([]byte, 512)
		n, err := conn.Read(buf)
		if err != nil {
			return "", err
		}
		line = string(buf[:n])
	} else if line, err = bufio.NewReader(conn).ReadString('\n'); err != nil {
		return "", err
	}
	// Not a probe's answer: Classify calls it NoAnswer.
	return ParseAnswer(line)
}
