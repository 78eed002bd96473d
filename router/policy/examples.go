package policy

import "strings"

// Examples returns NodePool annotation sets, valid and invalid: every set of the fail-safe
// table tests (a test fails when one is missing here) and more of each value grammar. The
// chart's admission policy (deploy/admission) must refuse exactly those FromAnnotations reports
// problems for; test/deploy writes each to a real API server to show that it does.
func Examples() []map[string]string {
	one := func(k, v string) map[string]string { return map[string]string{k: v} }
	window := func(schedule, duration string) map[string]string {
		return map[string]string{AnnotationWindowSchedule: schedule, AnnotationWindowDuration: duration}
	}
	var ex []map[string]string
	for _, v := range []string{"12.5%", "20abc%", "1e1%", "-3", "+3", "3.0", "101%", "", "99999999999", "0", "3", "0%", "25%", "100%", " 3 ", "007", "%", "2147483647", "2147483648"} {
		ex = append(ex, one(AnnotationMaxConcurrentDrains, v))
	}
	for _, v := range []string{"12.5%", "20abc%", "1e1%", "-3", "40%", "3"} {
		ex = append(ex, one(AnnotationRepairMaxUnhealthy, v))
	}
	for _, v := range []string{"shadow", "active", "Shadow", "dry-run", ""} {
		ex = append(ex, one(AnnotationMode, v))
	}
	for _, v := range []string{"20%", "5", "abc", "100.0%"} {
		ex = append(ex, one(AnnotationUrgentDrainMax, v))
	}
	for _, v := range []string{"1.5", "10", "0", "-1"} {
		ex = append(ex, one(AnnotationRepairMaxUnhealthyCap, v))
	}
	for _, v := range []string{"876000h", "-1h", "0s", "72h", "72h1s", "-0", "1h30m", ".5h", "1.h", "h", "1d", "99999999999h", " 2h "} {
		ex = append(ex, one(AnnotationDrainLead, v))
	}
	for _, v := range []string{"876000h", "24h", "90m", "1µs"} {
		ex = append(ex, one(AnnotationRestartGrace, v))
	}
	for _, v := range []string{"876000h", "soon", "ready", "Ready", "10m", "1h", "61m"} {
		ex = append(ex, one(AnnotationDrainSettle, v))
	}
	for _, k := range []string{AnnotationRespectPDB, AnnotationTaintUpcoming} {
		for _, v := range []string{"true", "false", "True", "1", "yes", "on"} {
			ex = append(ex, one(k, v))
		}
	}
	for _, v := range []string{UnreachableHold, UnreachableDrain, "Hold", "wait"} {
		ex = append(ex, one(AnnotationHoldWhileAlertsUnreachable, v))
	}
	for _, v := range []string{"Kafka.*", "Kafka(", "", "Kafka|Zookeeper", `Kafka.*{severity="critical"}`, "a{2}"} {
		ex = append(ex, one(AnnotationHoldWhileAlerts, v))
	}
	for _, v := range []string{"drain", "defer", "ignore", "Defer", "", "DRAIN", "reboot-in-place", " drain "} {
		ex = append(ex, one(AnnotationAction, v))
	}
	ex = append(ex,
		map[string]string{AnnotationAction: "drain", ActionKey("scheduled-change"): "DRAIN"},
		one(ActionKey("spot-interruption"), "ignore"),
		one(ActionKey("rebalance-recommendation"), "defer"),
		one(ScheduledActionKey("instance-retirement"), "reboot-in-place"),
		one(ScheduledActionKey("system-reboot"), "reboot-in-place"),
		one(ScheduledActionKey("instance-reboot"), "reboot-in-place"),
		one(ScheduledActionKey("instance-stop"), "drain"),
		// Unknown keys: a typo is refused, not silently ignored.
		one(strings.Replace(AnnotationMaxConcurrentDrains, "concurrent", "concurent", 1), "3"),
		one(ScheduledActionKey("instance-retire"), "defer"),
		// Maintenance windows.
		window("0 2 * * 6", "9999h"),
		window("0 2 * * 6", "7d"),
		window("0 2 * * *", "25h"),
		window("* * * * *", "1h"),
		window("* * * * *", "30s"),
		one(AnnotationWindowSchedule, "0 2 * * 6"),
		one(AnnotationWindowDuration, "4h"),
		window("0 0 * * 1", "120h"),
		window("0 2 * * 6", "144h"),
		window("0 2 * * 6", "4h"),
		window("CRON_TZ=Europe/Paris 0 2 * * sat", "4h"),
		window("0 2 * * 8", "4h"),
		window("60 2 * * 6", "4h"),
		window("0 2 * *", "4h"),
		window("saturdays", "4h"),
		window("@daily", "25h"),
		window("@weekly", "4h"),
		window("0 2 1,15 * *", "4h"),
		window("0 2 * * 6", "0s"),
		window("0 2 * * 6", "-4h"),
		map[string]string{AnnotationReschedule: "true"},
		map[string]string{AnnotationReschedule: "false"},
		map[string]string{AnnotationReschedule: "true", AnnotationWindowSchedule: "0 2 * * 6", AnnotationWindowDuration: "4h"},
		map[string]string{AnnotationEventWindow: "true"},
		map[string]string{AnnotationEventWindow: "false"},
		map[string]string{AnnotationEventWindow: "yes"},
		map[string]string{AnnotationEventWindow: "true", AnnotationWindowSchedule: "0 2 * * 6", AnnotationWindowDuration: "4h"},
		// Valid for the parser and the admission policy: that EC2 cannot express it is the
		// manager's problem to tell.
		map[string]string{AnnotationEventWindow: "true", AnnotationWindowSchedule: "CRON_TZ=Europe/Paris 0 2 * * 6", AnnotationWindowDuration: "4h"},
		map[string]string{AnnotationAction: "defer", AnnotationMaxConcurrentDrains: "1", AnnotationDrainLead: "2h", AnnotationWindowSchedule: "0 2 * * 6", AnnotationWindowDuration: "4h"},
		map[string]string{AnnotationAction: "defer", AnnotationMaxConcurrentDrains: "12.5%", AnnotationDrainLead: "2h"},
	)
	return ex
}
