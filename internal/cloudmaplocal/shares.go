package cloudmaplocal

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws/arn"
)

// ShareRequest is the body of the admin share calls: the RAM step that
// shares a namespace, named by ARN, with accounts or stops sharing it.
type ShareRequest struct {
	NamespaceArn string   `json:"namespaceArn"`
	Accounts     []string `json:"accounts"`
}

// Share shares a namespace with accounts, at once (as inside an AWS
// Organization with sharing enabled: no invitation to accept).
func (s *Server) Share(namespaceARN string, accounts ...string) error {
	return s.changeShare(namespaceARN, accounts, true)
}

// Unshare stops sharing a namespace with accounts: they lose access to it
// and to what they created in it, which stays.
func (s *Server) Unshare(namespaceARN string, accounts ...string) error {
	return s.changeShare(namespaceARN, accounts, false)
}

func (s *Server) changeShare(namespaceARN string, accounts []string, share bool) error {
	a, err := arn.Parse(namespaceARN)
	if err != nil || a.Service != "servicediscovery" || !strings.HasPrefix(a.Resource, "namespace/") {
		return fmt.Errorf("%q is not a Cloud Map namespace ARN", namespaceARN)
	}
	for _, acct := range accounts {
		if len(acct) != 12 || strings.Trim(acct, "0123456789") != "" {
			return fmt.Errorf("%q is not an AWS account id (12 digits)", acct)
		}
	}
	r := s.region(a.Region)
	s.mu.Lock()
	defer s.mu.Unlock()
	ns := r.st.Namespaces[resourceID(namespaceARN)]
	if ns == nil || ns.Arn != namespaceARN {
		return fmt.Errorf("namespace %s not found", namespaceARN)
	}
	consumers := slices.Clone(r.st.Shares[ns.Id])
	for _, acct := range accounts {
		switch {
		case acct == ns.Owner:
			return fmt.Errorf("account %s owns namespace %s: it cannot be shared with its owner", acct, namespaceARN)
		case share && !slices.Contains(consumers, acct):
			consumers = append(consumers, acct)
		case !share:
			consumers = slices.DeleteFunc(consumers, func(c string) bool { return c == acct })
		}
	}
	slices.Sort(consumers)
	if len(consumers) == 0 {
		delete(r.st.Shares, ns.Id)
	} else {
		r.st.Shares[ns.Id] = consumers
	}
	s.changed()
	s.opts.Logger.Info("namespace sharing changed", "namespace", namespaceARN, "consumers", consumers)
	return nil
}

// Shares lists every Region's shares: namespace ARN -> accounts.
func (s *Server) Shares() map[string][]string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := map[string][]string{}
	for _, r := range s.regions {
		for id, accounts := range r.st.Shares {
			if ns := r.st.Namespaces[id]; ns != nil {
				out[ns.Arn] = slices.Clone(accounts)
			}
		}
	}
	return out
}

// serveShares handles the admin endpoint: GET /shares lists, POST /shares
// shares, DELETE /shares unshares (body: ShareRequest).
func (s *Server) serveShares(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		var req ShareRequest
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			http.Error(w, "shares: "+err.Error(), http.StatusBadRequest)
			return
		}
		if err := s.changeShare(req.NamespaceArn, req.Accounts, r.Method == http.MethodPost); err != nil {
			http.Error(w, "shares: "+err.Error(), http.StatusBadRequest)
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(s.Shares())
}
