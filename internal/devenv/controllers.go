//go:build linux

package devenv

import (
	"context"
	"errors"

	"github.com/go-logr/logr"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/controller"
	"github.com/clustermap/clustermap/internal/kube"
)

// StartControllers runs `clustermap controller` for every cluster in this
// process, against the Cloud Map endpoint, until ctx ends; tune adjusts the
// options of each. The returned wait gives their errors once they stopped.
func (e *Env) StartControllers(ctx context.Context, cloudMapURL string, log func(*Cluster) logr.Logger, tune func(*controller.Options)) (wait func() error) {
	done := make(chan error, len(e.Clusters))
	for _, c := range e.Clusters {
		o := controller.Options{
			Config: c.Config, CloudMapEndpoint: cloudMapURL, Region: "us-east-1", CloudMapCredentials: cloudmapclient.LocalCredentials, MCS: true,
			// The shipped call budgets: the lab runs as users do.
			CloudMapQPS: controller.DefaultCloudMapQPS, CloudMapBurst: controller.DefaultCloudMapBurst,
			CloudMapDataQPS: controller.DefaultCloudMapDataQPS, CloudMapDataBurst: controller.DefaultCloudMapDataBurst,
			MetricsAddr: "0", ProbeAddr: "0", ExcludeNamespaces: kube.DefaultExcludeNamespaces,
			Log: log(c).WithName(c.ID),
		}
		if tune != nil {
			tune(&o)
		}
		go func() { done <- controller.Run(ctx, o) }()
	}
	return func() error {
		var errs []error
		for range e.Clusters {
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}
}
