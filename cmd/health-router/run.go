package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ctrl "sigs.k8s.io/controller-runtime"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/health-router/health-router/router/app"
	"github.com/health-router/health-router/router/calendar"
	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/options"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/router/shadow"
	"github.com/health-router/health-router/router/status"
)

func runRouter(ctx context.Context, o options.Run, stderr io.Writer) error {
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: o.LogLevel}))
	restCfg, err := options.RESTConfig(o.Kubeconfig, "")
	if err != nil {
		return err
	}
	return app.Run(ctx, o, restCfg, ctrlmetrics.Registry, log)
}

// warnOnly gives controller-runtime a logger for the one-shot commands: its warnings reach
// stderr, and without a logger it prints a stack trace once 30 s have passed.
func warnOnly(stderr io.Writer) {
	ctrl.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
}

func runDoctor(ctx context.Context, o options.Doctor, stdout, stderr io.Writer) error {
	warnOnly(stderr)
	// Without a cluster doctor still runs what needs none (the AWS side), and says what it
	// could not check.
	restCfg, err := options.RESTConfig(o.Kubeconfig, o.Context)
	if err != nil && !errors.Is(err, options.ErrNoCluster) {
		return err
	}
	report, err := app.Doctor(ctx, o, restCfg)
	if err != nil {
		return err
	}
	report.Print(stdout)
	if report.Failed() {
		return errors.New("doctor found problems (FAIL above)")
	}
	return nil
}

func runStatus(ctx context.Context, o options.Status, stdout, stderr io.Writer) error {
	warnOnly(stderr)
	restCfg, err := options.RESTConfig(o.Kubeconfig, o.Context)
	if err != nil {
		return err
	}
	scheme, err := cluster.NewScheme()
	if err != nil {
		return err
	}
	kube, err := client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("connecting to the cluster: %w", err)
	}
	if o.Shadow {
		name := cmp.Or(o.ShadowLedger, shadow.DefaultLedgerName)
		entries, err := shadow.ReadLedger(ctx, kube, o.Namespace, name)
		if errors.Is(err, shadow.ErrNoLedger) {
			// Not "no pool is in shadow": nothing was read. Another release's ledger name, or a
			// router that has recorded nothing yet; either way the reader cannot tell, and says so.
			return fmt.Errorf("no shadow ledger %s (nor, of a router before the store, the ConfigMap %s/%s): the router keeps it under --shadow-ledger (the chart: <release>-shadow, %q with release health-router) "+
				"and writes it at its first would-be outcome; check --shadow-ledger (and -n for a router not upgraded), or wait for an event", record.LedgerRecordName(name), o.Namespace, name, shadow.DefaultLedgerName)
		}
		if err != nil {
			return err
		}
		rep := shadow.BuildReport(entries, o.NodePool)
		if o.Output == "json" {
			return rep.WriteJSON(stdout)
		}
		return rep.WriteTable(stdout)
	}
	rep, err := status.Read(ctx, kube, o.Now, o.NodePool)
	if err != nil {
		return err
	}
	if o.ICS {
		return calendar.New(calendar.DefaultHorizon).Write(stdout, rep)
	}
	if o.Output == "json" {
		return rep.WriteJSON(stdout)
	}
	return rep.WriteTable(stdout)
}

func runHandback(ctx context.Context, o options.Handback, stdout, stderr io.Writer) error {
	warnOnly(stderr)
	restCfg, err := options.RESTConfig(o.Kubeconfig, o.Context)
	if err != nil {
		return err
	}
	rep, err := app.Handback(ctx, o, restCfg)
	if err != nil {
		return err
	}
	if o.Output == "json" {
		if err := rep.WriteJSON(stdout); err != nil {
			return err
		}
	} else if err := rep.WriteTable(stdout); err != nil {
		return err
	}
	if n := rep.Problems(); n > 0 {
		return fmt.Errorf("%d item(s) left as they were", n)
	}
	if !o.DryRun {
		fmt.Fprintln(stdout, "\nNext: restore Karpenter's own handling: its EventBridge rules, and ec2:DescribeInstanceStatus on its role (Terraform: takeover = false; docs/runbook.md).")
	}
	return nil
}
