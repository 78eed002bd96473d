package cwmetrics_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch/schemas"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch/types"
	"github.com/aws/smithy-go/transport/http/protocol/awsquery"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/health-router/health-router/router/cwmetrics"
	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/test/harness"
)

// motoCloudWatch returns a CloudWatch client for a fresh moto_server, and the transport its
// requests go through. It speaks awsQuery: the SDK's default protocol for CloudWatch is Smithy
// RPCv2 CBOR, which moto 5 does not serve; the request content (names, dimensions, statistic
// sets) is the same.
func motoCloudWatch(t *testing.T) (*cloudwatch.Client, *gzipSeen) {
	t.Helper()
	url := harness.Moto(t)
	cfg := harness.AWSConfig(nil)
	seen := &gzipSeen{}
	cfg.HTTPClient = &http.Client{Transport: seen}
	return cloudwatch.NewFromConfig(cfg, func(o *cloudwatch.Options) {
		o.BaseEndpoint = aws.String(url)
		o.Protocol = awsquery.New(schemas.GraniteServiceVersion20100801)
	}), seen
}

// gzipSeen counts the requests sent with a gzip-compressed body.
type gzipSeen struct{ n atomic.Int32 }

func (g *gzipSeen) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Header.Get("Content-Encoding") == "gzip" {
		g.n.Add(1)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// countingAPI counts the PutMetricData calls that reach the real client.
type countingAPI struct {
	*cloudwatch.Client
	puts atomic.Int32
}

func (c *countingAPI) PutMetricData(ctx context.Context, in *cloudwatch.PutMetricDataInput, opts ...func(*cloudwatch.Options)) (*cloudwatch.PutMetricDataOutput, error) {
	c.puts.Add(1)
	return c.Client.PutMetricData(ctx, in, opts...)
}

func dims(kv ...string) []types.Dimension {
	var ds []types.Dimension
	for i := 0; i < len(kv); i += 2 {
		ds = append(ds, types.Dimension{Name: aws.String(kv[i]), Value: aws.String(kv[i+1])})
	}
	return ds
}

// listMetrics returns every metric in the HealthRouter namespace as "Name Dim=Value,...",
// dimensions in the order CloudWatch returns them.
func listMetrics(t *testing.T, cw *cloudwatch.Client) []string {
	t.Helper()
	var got []string
	pages := cloudwatch.NewListMetricsPaginator(cw, &cloudwatch.ListMetricsInput{Namespace: aws.String(metrics.CloudWatchNamespace)})
	for pages.HasMorePages() {
		page, err := pages.NextPage(t.Context())
		if err != nil {
			t.Fatalf("ListMetrics: %v", err)
		}
		for _, m := range page.Metrics {
			var ds []string
			for _, d := range m.Dimensions {
				ds = append(ds, aws.ToString(d.Name)+"="+aws.ToString(d.Value))
			}
			got = append(got, aws.ToString(m.MetricName)+" "+strings.Join(ds, ","))
		}
	}
	slices.Sort(got)
	return got
}

func TestPublishToMoto(t *testing.T) {
	if testing.Short() {
		t.Skip("starts moto_server")
	}
	cw, gzipped := motoCloudWatch(t)
	api := &countingAPI{Client: cw}
	now := time.Now().UTC().Truncate(time.Minute)
	p := cwmetrics.New(api, cluster, clocktesting.NewFakeClock(now), slog.New(slog.DiscardHandler))

	p.Decision("scheduled-change", "defer")
	p.Decision("scheduled-change", "defer")
	p.Decision("spot-interruption", "drain")
	p.DeadLettered()
	p.Latency(120 * time.Millisecond)
	p.Latency(80 * time.Millisecond)
	p.Latency(time.Second)
	p.AWSCallError("DescribeImages")
	p.SetDeferred(4)
	if err := p.Flush(t.Context()); err != nil {
		t.Fatalf("Flush to moto: %v", err)
	}

	// The series, as CloudWatch lists them.
	want := []string{
		"AWSCallErrors ClusterName=prod-eu,API=DescribeImages",
		"DeadLettered ClusterName=prod-eu",
		"Decisions ClusterName=prod-eu,Kind=scheduled-change,Action=defer",
		"Decisions ClusterName=prod-eu,Kind=spot-interruption,Action=drain",
		"DeferredEvents ClusterName=prod-eu",
		"EventLatency ClusterName=prod-eu",
		"Heartbeat ClusterName=prod-eu",
	}
	if got := listMetrics(t, cw); !slices.Equal(got, want) {
		t.Errorf("ListMetrics:\n got %q\nwant %q", got, want)
	}

	// The values, read back per series.
	for _, tt := range []struct {
		metric string
		dims   []types.Dimension
		stat   types.Statistic
		want   float64
	}{
		{metrics.CWDecisions, dims("ClusterName", cluster, "Kind", "scheduled-change", "Action", "defer"), types.StatisticSum, 2},
		{metrics.CWDecisions, dims("ClusterName", cluster, "Kind", "spot-interruption", "Action", "drain"), types.StatisticSum, 1},
		{metrics.CWDeadLettered, dims("ClusterName", cluster), types.StatisticSum, 1},
		{metrics.CWAWSCallErrors, dims("ClusterName", cluster, "API", "DescribeImages"), types.StatisticSum, 1},
		{metrics.CWDeferredEvents, dims("ClusterName", cluster), types.StatisticMaximum, 4},
		{metrics.CWHeartbeat, dims("ClusterName", cluster), types.StatisticSum, 1},
		{metrics.CWEventLatency, dims("ClusterName", cluster), types.StatisticSampleCount, 3},
		{metrics.CWEventLatency, dims("ClusterName", cluster), types.StatisticSum, 1200},
		{metrics.CWEventLatency, dims("ClusterName", cluster), types.StatisticMinimum, 80},
		{metrics.CWEventLatency, dims("ClusterName", cluster), types.StatisticMaximum, 1000},
	} {
		name := fmt.Sprintf("%s %s %s", tt.metric, key(types.MetricDatum{Dimensions: tt.dims}), tt.stat)
		out, err := cw.GetMetricStatistics(t.Context(), &cloudwatch.GetMetricStatisticsInput{
			Namespace:  aws.String(metrics.CloudWatchNamespace),
			MetricName: aws.String(tt.metric),
			Dimensions: tt.dims,
			StartTime:  aws.Time(now.Add(-5 * time.Minute)),
			EndTime:    aws.Time(now.Add(5 * time.Minute)),
			Period:     aws.Int32(60),
			Statistics: []types.Statistic{tt.stat},
		})
		if err != nil {
			t.Fatalf("%s: GetMetricStatistics: %v", name, err)
		}
		if len(out.Datapoints) != 1 {
			t.Errorf("%s: %d datapoints, want 1", name, len(out.Datapoints))
			continue
		}
		dp := out.Datapoints[0]
		got := map[types.Statistic]*float64{
			types.StatisticSum: dp.Sum, types.StatisticMaximum: dp.Maximum, types.StatisticMinimum: dp.Minimum, types.StatisticSampleCount: dp.SampleCount,
		}[tt.stat]
		if got == nil || *got != tt.want {
			t.Errorf("%s = %v, want %v", name, aws.ToFloat64(got), tt.want)
		}
		wantUnit := types.StandardUnitCount
		if tt.metric == metrics.CWEventLatency {
			wantUnit = types.StandardUnitMilliseconds
		}
		if dp.Unit != wantUnit {
			t.Errorf("%s: unit %s, want %s", name, dp.Unit, wantUnit)
		}
	}
	if n := api.puts.Load(); n != 1 {
		t.Errorf("%d PutMetricData calls for %d datums, want 1", n, len(want))
	}

	// A large flush: 200 series, a body of tens of KiB, over the 10 KiB from which the SDK
	// gzip-compresses PutMetricData with a loaded config (this test's literal config compresses
	// every one). Splitting past 1,000 datums is tested with the fake: moto does not enforce
	// that limit, and takes seconds per thousand datums.
	for i := range 200 {
		p.Decision(fmt.Sprintf("kind-%04d", i), "drain")
	}
	if err := p.Flush(t.Context()); err != nil {
		t.Fatalf("Flush of 200 series to moto: %v", err)
	}
	if n := api.puts.Load(); n != 2 {
		t.Errorf("%d PutMetricData calls in all, want 2", n)
	}
	if gzipped.n.Load() != api.puts.Load() {
		t.Errorf("%d gzip-compressed requests, want every PutMetricData (%d): moto read them", gzipped.n.Load(), api.puts.Load())
	}
	for _, kind := range []string{"kind-0000", "kind-0199"} {
		out, err := cw.GetMetricStatistics(t.Context(), &cloudwatch.GetMetricStatisticsInput{
			Namespace:  aws.String(metrics.CloudWatchNamespace),
			MetricName: aws.String(metrics.CWDecisions),
			Dimensions: dims("ClusterName", cluster, "Kind", kind, "Action", "drain"),
			StartTime:  aws.Time(now.Add(-5 * time.Minute)),
			EndTime:    aws.Time(now.Add(5 * time.Minute)),
			Period:     aws.Int32(60),
			Statistics: []types.Statistic{types.StatisticSum},
		})
		if err != nil {
			t.Fatalf("GetMetricStatistics %s: %v", kind, err)
		}
		if len(out.Datapoints) != 1 || aws.ToFloat64(out.Datapoints[0].Sum) != 1 {
			t.Errorf("Decisions %s: datapoints %+v, want one with Sum 1", kind, out.Datapoints)
		}
	}
}
