package dns

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

// scheme holds only what the DNS server reads: it needs neither the
// controllers nor the AWS SDK.
var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(corev1.AddToScheme(s))
	utilruntime.Must(discoveryv1.AddToScheme(s))
	utilruntime.Must(mcsv1beta1.Install(s))
	return s
}()

// source keeps a Handler's index current from informers on ServiceImports,
// MCS-labelled EndpointSlices and Namespaces. Changes are coalesced: the
// index is rebuilt at most every 50 ms.
type source struct {
	Zone    string
	Handler *Handler
	synced  chan struct{}
}

// Run watches the cluster until ctx ends; synced is closed once the
// informers synced and the first index is served.
func (s *source) Run(ctx context.Context, cfg *rest.Config) error {
	mcs, err := labels.NewRequirement(mcsv1beta1.LabelServiceName, selection.Exists, nil)
	if err != nil {
		return err
	}
	ca, err := cache.New(cfg, cache.Options{
		Scheme: scheme,
		ByObject: map[client.Object]cache.ByObject{
			&discoveryv1.EndpointSlice{}: {Label: labels.NewSelector().Add(*mcs)},
		},
	})
	if err != nil {
		return err
	}
	changed := make(chan struct{}, 1)
	poke := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	handler := toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { poke() },
		UpdateFunc: func(any, any) { poke() },
		DeleteFunc: func(any) { poke() },
	}
	for _, o := range []client.Object{&mcsv1beta1.ServiceImport{}, &discoveryv1.EndpointSlice{}, &corev1.Namespace{}} {
		inf, err := ca.GetInformer(ctx, o)
		if err != nil {
			return err
		}
		if _, err := inf.AddEventHandler(handler); err != nil {
			return err
		}
	}
	errc := make(chan error, 1)
	go func() { errc <- ca.Start(ctx) }()
	if !ca.WaitForCacheSync(ctx) {
		return <-errc
	}
	rebuild := func() error {
		sis := &mcsv1beta1.ServiceImportList{}
		slices := &discoveryv1.EndpointSliceList{}
		nss := &corev1.NamespaceList{}
		for _, l := range []client.ObjectList{sis, slices, nss} {
			if err := ca.List(ctx, l); err != nil {
				return err
			}
		}
		names := make([]string, len(nss.Items))
		for i, n := range nss.Items {
			names[i] = n.Name
		}
		s.Handler.SetIndex(Build(s.Zone, s.Handler.TTL, sis.Items, slices.Items, names))
		return nil
	}
	if err := rebuild(); err != nil {
		return err
	}
	close(s.synced)
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			return err
		case <-changed:
			time.Sleep(50 * time.Millisecond) // coalesce a burst of changes
			select {
			case <-changed:
			default:
			}
			if err := rebuild(); err != nil {
				return err
			}
		}
	}
}
