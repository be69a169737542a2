package cloudmaplocal

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The emulator's state. Everything is guarded by Server.mu; the JSON
// shape is the --data-dir snapshot format.

type namespaceRec struct {
	Id               string
	Arn              string
	Owner            string // the account that created it
	Name             string
	Type             string // HTTP, DNS_PRIVATE, DNS_PUBLIC
	Description      string
	HttpName         string
	Vpc              string `json:",omitempty"`
	HostedZoneId     string `json:",omitempty"`
	SOATTL           *int64 `json:",omitempty"`
	CreateDate       time.Time
	CreatorRequestId string
}

type serviceRec struct {
	Id                      string
	Arn                     string
	Name                    string
	NamespaceId             string
	Description             string
	Type                    string                   // HTTP, DNS_HTTP, DNS
	DnsConfig               *DnsConfig               `json:",omitempty"`
	HealthCheckConfig       *HealthCheckConfig       `json:",omitempty"`
	HealthCheckCustomConfig *HealthCheckCustomConfig `json:",omitempty"`
	CreateDate              time.Time
	CreatorRequestId        string
	CreatedBy               string            // the account; the namespace's owner owns it
	Attributes              map[string]string `json:",omitempty"`
	// Revision changes whenever what DiscoverInstances returns may change.
	Revision  int64
	Instances map[string]*instanceRec
	// history is what the data plane may still show (Profile.ReadLag):
	// the recent changes, oldest first, each with what it replaced.
	history []instanceChange
}

// instanceChange is one change of a service's instances: prev is the
// record it replaced (nil: none), prevRevision the revision before it.
type instanceChange struct {
	at           time.Time
	id           string
	prev         *instanceRec
	prevRevision int64
}

type instanceRec struct {
	Id               string
	CreatorRequestId string
	// Attributes is never changed in place (a re-registration replaces the
	// record), so responses may share it after the lock is released.
	Attributes map[string]string
	Health     string // HEALTHY or UNHEALTHY
	CreatedBy  string // the account that registered it
}

// operationRec is an asynchronous operation. Until it is final it carries
// what completing it applies, as data, so that a restart can finish it.
type operationRec struct {
	Id           string
	Type         string
	Status       string
	ErrorCode    string `json:",omitempty"`
	ErrorMessage string `json:",omitempty"`
	CreateDate   time.Time
	UpdateDate   time.Time
	Targets      map[string]string
	Account      string    // who asked for it
	Owner        string    // the namespace's owner
	CreatorKey   string    `json:",omitempty"`
	DueAt        time.Time `json:",omitempty"`
	Pending      *pending  `json:",omitempty"`
}

type pending struct {
	Namespace   *namespaceRec  `json:",omitempty"` // CREATE_NAMESPACE, UPDATE_NAMESPACE
	Instance    *instanceRec   `json:",omitempty"` // REGISTER_INSTANCE
	ServiceId   string         `json:",omitempty"`
	ServiceDiff *ServiceChange `json:",omitempty"` // UPDATE_SERVICE
}

type state struct {
	Namespaces map[string]*namespaceRec
	Services   map[string]*serviceRec
	Operations map[string]*operationRec
	Tags       map[string][]Tag // by ARN
	// Creators maps an idempotency key (operation, CreatorRequestId) to the
	// operation or resource it created.
	Creators map[string]string
	// Shares are the RAM shares: namespace id -> the accounts it is
	// shared with. Shares are regional, like namespaces.
	Shares map[string][]string
}

func newState() *state {
	return &state{
		Namespaces: map[string]*namespaceRec{},
		Services:   map[string]*serviceRec{},
		Operations: map[string]*operationRec{},
		Tags:       map[string][]Tag{},
		Creators:   map[string]string{},
		Shares:     map[string][]string{},
	}
}

// index holds lookups derived from state, rebuilt after a load.
type index struct {
	nsByHTTPName map[string]string            // owner account + "/" + HttpName -> namespace id
	svcByName    map[string]map[string]string // namespace id -> service name -> id
	nsInstances  map[string]int               // namespace id -> instance count
	// ops are each account's operations on its own namespaces in reverse
	// ListOperations order (descending pageKeyNewestFirst: oldest first,
	// so that a new one is appended), kept as operations come and go:
	// sorting them all at every call held the region's lock for 17 ms a
	// call, each of 50 clusters polling (the emulator's cost, not Cloud
	// Map's).
	ops map[string][]opEntry
}

type opEntry struct {
	key string
	op  *operationRec
}

// addOperation places op in its account's listing order.
func (ix *index) addOperation(op *operationRec) {
	if op.Account != op.Owner {
		return // not listed (ListOperations)
	}
	e := opEntry{pageKeyNewestFirst(op.CreateDate, op.Id), op}
	list := ix.ops[op.Account]
	i, _ := slices.BinarySearchFunc(list, e.key, func(e opEntry, key string) int { return strings.Compare(key, e.key) })
	ix.ops[op.Account] = slices.Insert(list, i, e)
}

// dropOperations takes the operations no longer in st out of the order.
func (ix *index) dropOperations(st *state) {
	for account, list := range ix.ops {
		ix.ops[account] = slices.DeleteFunc(list, func(e opEntry) bool { return st.Operations[e.op.Id] != e.op })
	}
}

// nameKey keys nsByHTTPName: namespace names are unique per account.
func nameKey(owner, httpName string) string { return owner + "/" + httpName }

func buildIndex(st *state) *index {
	ix := &index{nsByHTTPName: map[string]string{}, svcByName: map[string]map[string]string{}, nsInstances: map[string]int{}, ops: map[string][]opEntry{}}
	for _, op := range st.Operations {
		ix.addOperation(op)
	}
	for _, ns := range st.Namespaces {
		ix.nsByHTTPName[nameKey(ns.Owner, ns.HttpName)] = ns.Id
		ix.svcByName[ns.Id] = map[string]string{}
	}
	for _, svc := range st.Services {
		if ix.svcByName[svc.NamespaceId] == nil {
			ix.svcByName[svc.NamespaceId] = map[string]string{}
		}
		ix.svcByName[svc.NamespaceId][svc.Name] = svc.Id
		ix.nsInstances[svc.NamespaceId] += len(svc.Instances)
	}
	return ix
}

const idAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

func randomID(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = idAlphabet[int(b[i])%len(idAlphabet)]
	}
	return string(b)
}

// Ids in the service's formats: ns-ylexjili4cdxy3xm, srv-p5zdwlg5uvvzjita,
// and operation ids of 32+8 characters.
func newNamespaceID() string { return "ns-" + randomID(16) }
func newServiceID() string   { return "srv-" + randomID(16) }
func newOperationID() string { return randomID(32) + "-" + randomID(8) }
func newHostedZoneID() string {
	return "Z" + strings.ToUpper(randomID(13))
}

// snapshot is the --data-dir file: every Region's state.
type snapshot struct {
	Regions map[string]*state
}

// loadSnapshot reads a --data-dir snapshot; a missing one is no state. A
// snapshot from before Regions and accounts (one state at the top) is the
// default Region's, everything in it the default account's.
func loadSnapshot(dir, defaultRegion, defaultAccount string) (map[string]*state, error) {
	path := filepath.Join(dir, snapshotName)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]*state{}, nil
	}
	if err != nil {
		return nil, err
	}
	var snap snapshot
	if err := json.Unmarshal(data, &snap); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if snap.Regions == nil {
		old := newState()
		if err := json.Unmarshal(data, old); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		snap.Regions = map[string]*state{defaultRegion: old}
	}
	for _, st := range snap.Regions {
		fill(st, defaultAccount)
	}
	return snap.Regions, nil
}

// fill makes the maps an older snapshot lacks and gives records saved
// before accounts existed to account.
func fill(st *state, account string) {
	empty := newState()
	if st.Namespaces == nil {
		st.Namespaces = empty.Namespaces
	}
	if st.Services == nil {
		st.Services = empty.Services
	}
	if st.Operations == nil {
		st.Operations = empty.Operations
	}
	if st.Tags == nil {
		st.Tags = empty.Tags
	}
	if st.Creators == nil {
		st.Creators = empty.Creators
	}
	if st.Shares == nil {
		st.Shares = empty.Shares
	}
	for _, ns := range st.Namespaces {
		if ns.Owner == "" {
			ns.Owner = account
		}
	}
	for _, svc := range st.Services {
		if svc.CreatedBy == "" {
			svc.CreatedBy = account
		}
		if svc.Instances == nil {
			svc.Instances = map[string]*instanceRec{}
		}
		for _, inst := range svc.Instances {
			if inst.CreatedBy == "" {
				inst.CreatedBy = account
			}
		}
	}
	for _, op := range st.Operations {
		if op.Account == "" {
			op.Account, op.Owner = account, account
		}
	}
}

const snapshotName = "cloudmap-state.json"

// writeSnapshot replaces the snapshot atomically: a reader (or a crash)
// sees the old file or the new one, never half of one.
func writeSnapshot(dir string, data []byte) error {
	tmp, err := os.CreateTemp(dir, snapshotName+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), filepath.Join(dir, snapshotName))
}
