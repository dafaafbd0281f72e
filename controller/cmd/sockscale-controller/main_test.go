package main

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/sockscale/sockscale/controller/internal/config"
)

func TestFlagErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--stats-bind-address=8443"}, `--stats-bind-address="8443": want [host]:port`},
		{[]string{"--autoscaler-config=just-a-name"}, `--autoscaler-config="just-a-name": want namespace/name`},
		{[]string{"extra"}, "takes flags only"},
		{[]string{"--activator-selector=a in (b"}, `--activator-selector="a in (b"`},
		{[]string{"--activator-selector="}, "must select something"},
		{[]string{"--activator-port=0"}, "--activator-port=0: want 1..65535"},
	}
	for _, tt := range tests {
		if _, err := parseFlags(tt.args); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: err = %v, want %q", tt.args, err, tt.want)
		}
	}
	t.Setenv("POD_NAMESPACE", "ops")
	f, err := parseFlags(nil)
	if err != nil || f.configMap != "ops/sockscale-autoscaler" || f.statsAddr != ":8443" || f.activatorNamespace != "ops" || f.activatorPort != 8012 {
		t.Errorf("defaults: %+v, %v", f, err)
	}
}

func TestConfigWatcherKeepsPreviousOnBadEdit(t *testing.T) {
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "sockscale-autoscaler"},
		Data:       map[string]string{"stable-window": "30s"},
	}
	c := fake.NewClientBuilder().WithObjects(cm).Build()
	var current atomic.Pointer[config.Config]
	current.Store(config.Defaults())
	w := &configWatcher{reader: c, ref: "ops/sockscale-autoscaler", current: &current, period: time.Second}
	ctx := context.Background()

	w.refresh(ctx)
	if got := current.Load().StableWindow; got != 30*time.Second {
		t.Fatalf("after a good edit the stable window is %v, want 30s", got)
	}
	cm.Data = map[string]string{"stable-window": "2s"}
	if err := c.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	w.refresh(ctx)
	if got := current.Load().StableWindow; got != 30*time.Second {
		t.Errorf("after a bad edit the stable window is %v, want the previous 30s", got)
	}
	if err := c.Delete(ctx, cm); err != nil {
		t.Fatal(err)
	}
	w.refresh(ctx)
	if got := current.Load().StableWindow; got != time.Minute {
		t.Errorf("without the ConfigMap the stable window is %v, want the default 1m", got)
	}
}
