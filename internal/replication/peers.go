package replication

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/clustermap/clustermap/internal/kube"
)

var peerUp = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "clustermap_syndicate_peer_up",
	Help: "1 when a peer cluster's API server answers and its caches are synced, 0 otherwise.",
}, []string{"peer"})

// peerTokenExpiry makes an expiring peer grant visible before it lapses
// (ClustermapSyndicatePeerTokenExpiring): peer-kubeconfig's tokens expire.
var peerTokenExpiry = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "clustermap_syndicate_peer_token_expiry_timestamp_seconds",
	Help: "When the token of a peer's kubeconfig expires (its exp claim), in Unix seconds; absent for credentials that do not say.",
}, []string{"peer"})

// Peer is one cluster from the peers directory: a cache of its Services
// and EndpointSlices for reads, a direct client for writes.
type Peer struct {
	Name    string
	Client  client.Client // reads from the cache
	Writer  client.Client // reads and writes at the API server
	cache   cache.Cache
	probe   *kubernetes.Clientset
	hash    [32]byte
	stop    context.CancelFunc
	up      bool
	wasDown bool
	checked bool
	config  []byte
	// broken says why the kubeconfig cannot be used (it does not parse,
	// or it runs a command): the peer is kept as down, with its replicas,
	// until the file changes.
	broken error
}

// Peers watches a directory of kubeconfig files, one peer each, named by
// the file name without extension: the peer's own --cluster-name.
type Peers struct {
	Dir    string
	Scheme *runtime.Scheme
	Log    logr.Logger
	// Namespaces, when set, are the only namespaces watched in peers;
	// ExcludeNamespaces are never watched.
	Namespaces, ExcludeNamespaces []string
	// AllowExecPlugins lets peer kubeconfigs run commands (exec plugins,
	// auth providers): whoever writes the peers directory could otherwise
	// run code in the controller.
	AllowExecPlugins bool
	// AllowInsecurePeers lets peer kubeconfigs read local files (tokens,
	// certificates), skip TLS verification, use plain HTTP or a proxy:
	// otherwise whoever writes the peers directory could have the
	// controller's own credentials sent, or its files read, anywhere.
	AllowInsecurePeers bool
	// OnObject is told of every peer Service or EndpointSlice change, by the
	// Service's namespace and name; OnChange of peers coming and going.
	OnObject func(ns, name string)
	OnChange func()
	// OnBroken is told of a kubeconfig that cannot be used, once per
	// version of the file.
	OnBroken func(peer, file string, err error)

	mu    sync.Mutex
	peers map[string]*Peer
}

// Start polls the directory and the peers' health until ctx ends. Polling
// (every 2 s) also sees kubeconfigs mounted from Secrets, which change by
// symlink swaps.
func (ps *Peers) Start(ctx context.Context) error {
	ps.mu.Lock()
	ps.peers = map[string]*Peer{}
	ps.mu.Unlock()
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		ps.scan(ctx)
		ps.checkHealth(ctx)
		select {
		case <-ctx.Done():
			ps.mu.Lock()
			for _, p := range ps.peers {
				p.stop()
			}
			ps.mu.Unlock()
			return nil
		case <-t.C:
		}
	}
}

func (ps *Peers) scan(ctx context.Context) {
	files := map[string][]byte{}
	paths := map[string]string{}
	entries, err := os.ReadDir(ps.Dir)
	if err != nil && !os.IsNotExist(err) {
		ps.Log.Error(err, "reading the peers directory", "dir", ps.Dir)
		return
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		path := filepath.Join(ps.Dir, e.Name())
		if fi, err := os.Stat(path); err != nil || fi.IsDir() {
			continue
		}
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		name := strings.TrimSuffix(e.Name(), filepath.Ext(e.Name()))
		files[name], paths[name] = data, path
	}
	changed := false
	ps.mu.Lock()
	for name, p := range ps.peers {
		if data, ok := files[name]; !ok || sha256.Sum256(data) != p.hash {
			p.stop()
			delete(ps.peers, name)
			peerUp.DeleteLabelValues(name)
			peerTokenExpiry.DeleteLabelValues(name)
			if !ok {
				ps.Log.Info("peer removed from the directory; its replicas here go after the grace period", "peer", name)
			}
			changed = true
		}
	}
	ps.mu.Unlock()
	for name, data := range files {
		ps.mu.Lock()
		_, running := ps.peers[name]
		ps.mu.Unlock()
		if running {
			continue
		}
		p, err := ps.start(ctx, name, data)
		if err != nil {
			// Kept as a peer that is down: its replicas here stay.
			file := paths[name]
			ps.Log.Error(err, "peer kubeconfig unusable; the peer counts as down, its replicas are kept; fix the file", "peer", name, "file", file)
			if ps.OnBroken != nil {
				ps.OnBroken(name, file, err)
			}
			p = &Peer{Name: name, hash: sha256.Sum256(data), stop: func() {}, broken: err, checked: true}
			peerUp.WithLabelValues(name).Set(0)
		}
		if exp, ok := TokenExpiry(data); ok {
			peerTokenExpiry.WithLabelValues(name).Set(float64(exp.Unix()))
		}
		ps.mu.Lock()
		ps.peers[name] = p
		ps.mu.Unlock()
		ps.Log.Info("peer added", "peer", name)
		changed = true
	}
	if changed && ps.OnChange != nil {
		ps.OnChange()
	}
}

// ErrExecPlugin refuses a peer kubeconfig that would run a command.
var ErrExecPlugin = errors.New("the kubeconfig runs a command to get credentials (exec plugin or auth provider); refused: use a token or client certificate, or pass --allow-exec-plugins if whoever can write the peers directory may run commands in the controller")

// ErrInsecurePeer refuses a peer kubeconfig that reads local files or
// could send credentials somewhere other than a verified TLS server.
var ErrInsecurePeer = errors.New("the kubeconfig reads local files, skips TLS verification, or talks plain HTTP or through a proxy; refused: inline certificate-authority-data, client-certificate-data and token, use an https:// server, or pass --allow-insecure-peers if whoever can write the peers directory may do so")

// checkPeer names what makes a peer kubeconfig insecure.
func checkPeer(raw *clientcmdapi.Config) error {
	if problems := kube.KubeconfigProblems(raw); len(problems) > 0 {
		return fmt.Errorf("%w (%s)", ErrInsecurePeer, strings.Join(problems, "; "))
	}
	return nil
}

// TokenExpiry reads when the token of a kubeconfig's current user
// expires: the exp claim of a JWT, unverified (the API server verifies
// it; this only says when to renew). ok is false for credentials that do
// not say.
func TokenExpiry(kubeconfig []byte) (time.Time, bool) {
	raw, err := clientcmd.Load(kubeconfig)
	if err != nil || raw.Contexts[raw.CurrentContext] == nil || raw.AuthInfos[raw.Contexts[raw.CurrentContext].AuthInfo] == nil {
		return time.Time{}, false
	}
	parts := strings.Split(raw.AuthInfos[raw.Contexts[raw.CurrentContext].AuthInfo].Token, ".")
	if len(parts) != 3 {
		return time.Time{}, false
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	var claims struct {
		Exp int64 `json:"exp"`
	}
	if err != nil || json.Unmarshal(payload, &claims) != nil || claims.Exp == 0 {
		return time.Time{}, false
	}
	return time.Unix(claims.Exp, 0), true
}

// peerConfig reads a peer kubeconfig, refusing commands, local files and
// unverified or plain connections unless allowed.
func peerConfig(kubeconfig []byte, allowExec, allowInsecure bool) (*rest.Config, error) {
	raw, err := clientcmd.Load(kubeconfig)
	if err != nil {
		return nil, err
	}
	if !allowInsecure {
		if err := checkPeer(raw); err != nil {
			return nil, err
		}
	}
	if !allowExec {
		for _, a := range raw.AuthInfos {
			if a.Exec != nil || a.AuthProvider != nil {
				return nil, ErrExecPlugin
			}
		}
	}
	return clientcmd.NewDefaultClientConfig(*raw, &clientcmd.ConfigOverrides{}).ClientConfig()
}

// peerMapper knows the kinds read from and written to peers (and their
// lists), so that nothing needs the peer's discovery API: a peer that is
// down at start is set up all the same, and counts as down until it
// answers.
func peerMapper() meta.RESTMapper {
	m := meta.NewDefaultRESTMapper(nil)
	for _, k := range []struct {
		gv       schema.GroupVersion
		kind     string
		resource string
		scope    meta.RESTScope
	}{
		{corev1.SchemeGroupVersion, "Service", "services", meta.RESTScopeNamespace},
		{discoveryv1.SchemeGroupVersion, "EndpointSlice", "endpointslices", meta.RESTScopeNamespace},
		{corev1.SchemeGroupVersion, "Namespace", "namespaces", meta.RESTScopeRoot},
	} {
		plural, singular := k.gv.WithResource(k.resource), k.gv.WithResource(strings.ToLower(k.kind))
		m.AddSpecific(k.gv.WithKind(k.kind), plural, singular, k.scope)
		m.AddSpecific(k.gv.WithKind(k.kind+"List"), plural, singular, k.scope)
	}
	return m
}

// cacheNamespaces limits a peer's caches to the namespaces replicated.
func (ps *Peers) cacheNamespaces() map[string]cache.Config {
	if len(ps.Namespaces) > 0 {
		m := map[string]cache.Config{}
		for _, ns := range ps.Namespaces {
			if !slices.Contains(ps.ExcludeNamespaces, ns) {
				m[ns] = cache.Config{}
			}
		}
		return m
	}
	if len(ps.ExcludeNamespaces) == 0 {
		return nil
	}
	var not []fields.Selector
	for _, ns := range ps.ExcludeNamespaces {
		not = append(not, fields.OneTermNotEqualSelector("metadata.namespace", ns))
	}
	return map[string]cache.Config{cache.AllNamespaces: {FieldSelector: fields.AndSelectors(not...)}}
}

func (ps *Peers) start(ctx context.Context, name string, kubeconfig []byte) (*Peer, error) {
	cfg, err := peerConfig(kubeconfig, ps.AllowExecPlugins, ps.AllowInsecurePeers)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst, cfg.Timeout = 200, 400, 10*time.Second
	mapper := peerMapper()
	c, err := cache.New(cfg, cache.Options{Scheme: ps.Scheme, Mapper: mapper, DefaultNamespaces: ps.cacheNamespaces()})
	if err != nil {
		return nil, err
	}
	cl, err := client.New(cfg, client.Options{Scheme: ps.Scheme, Mapper: mapper, Cache: &client.CacheOptions{Reader: c}})
	if err != nil {
		return nil, err
	}
	direct, err := client.New(cfg, client.Options{Scheme: ps.Scheme, Mapper: mapper})
	if err != nil {
		return nil, err
	}
	probeCfg := *cfg
	probeCfg.Timeout = 2 * time.Second
	probe, err := kubernetes.NewForConfig(&probeCfg)
	if err != nil {
		return nil, err
	}
	pctx, stop := context.WithCancel(ctx)
	notify := toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { ps.notify(o) },
		UpdateFunc: func(_, o any) { ps.notify(o) },
		DeleteFunc: func(o any) { ps.notify(o) },
	}
	for _, obj := range []client.Object{&corev1.Service{}, &discoveryv1.EndpointSlice{}} {
		inf, err := c.GetInformer(pctx, obj, cache.BlockUntilSynced(false))
		if err != nil {
			stop()
			return nil, err
		}
		if _, err := inf.AddEventHandler(notify); err != nil {
			stop()
			return nil, err
		}
	}
	go func() {
		if err := c.Start(pctx); err != nil {
			ps.Log.Error(err, "peer cache stopped", "peer", name)
		}
	}()
	return &Peer{Name: name, Client: cl, Writer: direct, cache: c, probe: probe, hash: sha256.Sum256(kubeconfig), stop: stop, config: kubeconfig}, nil
}

func (ps *Peers) notify(o any) {
	if d, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	obj, ok := o.(client.Object)
	if !ok || ps.OnObject == nil {
		return
	}
	name := obj.GetName()
	if s, ok := obj.(*discoveryv1.EndpointSlice); ok {
		name = s.Labels[discoveryv1.LabelServiceName]
	}
	if name != "" {
		ps.OnObject(obj.GetNamespace(), name)
	}
}

// checkHealth probes every peer; one coming back triggers a full resync,
// since what changed here while it was down was not written there.
func (ps *Peers) checkHealth(ctx context.Context) {
	ps.mu.Lock()
	peers := make([]*Peer, 0, len(ps.peers))
	for _, p := range ps.peers {
		peers = append(peers, p)
	}
	ps.mu.Unlock()
	back := false
	for _, p := range peers {
		if p.broken != nil {
			continue // down until its file changes
		}
		_, err := p.probe.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && p.wasDown {
			// Informers that lost their server back off for up to 30 s and
			// serve stale objects meanwhile: start afresh instead.
			ps.restart(ctx, p)
			continue
		}
		up := err == nil && synced(ctx, p.cache)
		ps.mu.Lock()
		if up && !p.up {
			back = true
			ps.Log.Info("peer reachable", "peer", p.Name)
		} else if (!up && p.up) || (err != nil && !p.checked) {
			ps.Log.Error(err, "peer unreachable; its replicas are kept as they are and retried", "peer", p.Name)
			p.wasDown = true
		}
		p.up, p.checked = up, true
		ps.mu.Unlock()
		peerUp.WithLabelValues(p.Name).Set(map[bool]float64{true: 1}[up])
	}
	if back && ps.OnChange != nil {
		ps.OnChange()
	}
}

// restart replaces a peer's caches with new ones; it turns up once they
// are synced.
func (ps *Peers) restart(ctx context.Context, old *Peer) {
	p, err := ps.start(ctx, old.Name, old.config)
	if err != nil {
		ps.Log.Error(err, "restarting peer", "peer", old.Name)
		return
	}
	old.stop()
	ps.mu.Lock()
	if ps.peers[old.Name] == old {
		ps.peers[old.Name] = p
	} else {
		p.stop()
	}
	ps.mu.Unlock()
}

// synced reports whether a cache's informers have synced, waiting 100 ms at most.
func synced(ctx context.Context, c cache.Cache) bool {
	sctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	return c.WaitForCacheSync(sctx)
}

// Reachable lists the peers that answer, by name.
func (ps *Peers) Reachable() []*Peer {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var out []*Peer
	for _, p := range ps.peers {
		if p.up {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Down lists configured peers that do not answer.
func (ps *Peers) Down() []string {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var out []string
	for _, p := range ps.peers {
		if !p.up {
			out = append(out, p.Name)
		}
	}
	sort.Strings(out)
	return out
}

// Configured reports whether a peer is in the directory (up or down).
func (ps *Peers) Configured(name string) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	_, ok := ps.peers[name]
	return ok
}
