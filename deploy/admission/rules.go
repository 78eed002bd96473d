package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/policy"
)

// Value grammars, as Go regular expressions (RE2, which CEL's matches() uses too).
const (
	// durationRE is what time.ParseDuration takes: an optional sign, then 0 or a sequence of
	// decimal numbers with a unit each. A value it passes may still overflow time.Duration: CEL's
	// duration() then fails, and the failure policy refuses the write.
	durationRE = `^[-+]?(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$`
	// countRE is a whole number in int32 once its leading zeros are gone (checked after).
	countRE   = `^0*[0-9]{1,10}$`
	percentRE = `^0*[0-9]{1,3}%$`
)

// cronRE is what robfig/cron's standard parser takes (router/policy's parseSchedule): an
// optional CRON_TZ= or TZ= zone, then a descriptor or five fields within their bounds. It does
// not check a zone's name or that a range's start is not after its end; the router's parser
// does, and reports them on the NodePool.
func cronRE() string {
	item := func(n string) string { return `(\*|\?|` + n + `(-` + n + `)?)(/0*[1-9][0-9]*)?` }
	field := func(n string) string { return item(n) + `(,` + item(n) + `)*` }
	fields := []string{
		field(`0*([0-9]|[1-5][0-9])`),      // minute
		field(`0*([0-9]|1[0-9]|2[0-3])`),   // hour
		field(`0*([1-9]|[12][0-9]|3[01])`), // day of month
		field(`(0*([1-9]|1[0-2])|(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec))`), // month
		field(`(0*[0-6]|(?i:sun|mon|tue|wed|thu|fri|sat))`),                              // day of week
	}
	every := strings.TrimSuffix(strings.TrimPrefix(durationRE, "^"), "$")
	return `^((CRON_TZ|TZ)=[^ ]* +)?(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|@every ` + every + `|` + strings.Join(fields, `\s+`) + `)$`
}

// validation is one rule of the policy: CEL that is true when the write is admitted, and the
// message that names the key and says what it wants.
type validation struct{ expression, message string }

// grammar is a key's rule on its trimmed value v (a CEL expression), and what it wants.
type grammar struct {
	rule func(v string) string
	want string
}

func oneOf(vals ...string) func(string) string {
	return func(v string) string {
		q := make([]string, len(vals))
		for i, s := range vals {
			q[i] = cel(s)
		}
		return v + " in [" + strings.Join(q, ", ") + "]"
	}
}

// boundedDuration: a Go duration from 0 to max.
func boundedDuration(v string, max time.Duration) string {
	return fmt.Sprintf("%s.matches(%s) && duration(%s) >= duration('0s') && duration(%s) <= duration(%s)", v, cel(durationRE), v, v, cel(max.String()))
}

func countOrPercent(v string) string {
	return fmt.Sprintf("%s.matches(%s) ? int(%s) <= 2147483647 : (%s.matches(%s) && int(%s.substring(0, size(%s) - 1)) <= 100)", v, cel(countRE), v, v, cel(percentRE), v, v)
}

var (
	bools = oneOf("1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False") // strconv.ParseBool
	// actions is what every action key takes; rebootActions the keys of the types AWS reboots in place.
	actions       = grammar{oneOf(string(policy.ActionDrain), string(policy.ActionDefer), string(policy.ActionIgnore)), "drain, defer or ignore, in lower case"}
	rebootActions = grammar{oneOf(string(policy.ActionDrain), string(policy.ActionDefer), string(policy.ActionIgnore), string(policy.ActionRebootInPlace)), "drain, defer, ignore or reboot-in-place, in lower case"}
	countOrPct    = grammar{countOrPercent, "a whole number of nodes (0 or more) or a whole percentage of them, 0% to 100%"}
)

// grammars returns the rule of every key of router/policy's table but the two of the maintenance
// window, which are read together (windowValidations); an error names a key with no rule.
func grammars() (map[string]grammar, error) {
	g := map[string]grammar{
		policy.AnnotationAction:              actions,
		policy.AnnotationMaxConcurrentDrains: countOrPct,
		policy.AnnotationRepairMaxUnhealthy:  countOrPct,
		policy.AnnotationUrgentDrainMax:      countOrPct,
		policy.AnnotationRepairMaxUnhealthyCap: {func(v string) string {
			return fmt.Sprintf("%s.matches(%s) && int(%s) <= 2147483647", v, cel(countRE), v)
		}, "a whole number of nodes, 0 or more"},
		policy.AnnotationDrainLead: {func(v string) string { return boundedDuration(v, policy.MaxDrainLead) },
			"a duration such as 1h or 90m, at most " + short(policy.MaxDrainLead)},
		policy.AnnotationRestartGrace: {func(v string) string { return boundedDuration(v, policy.MaxRestartGrace) },
			"a duration such as 1h or 90m, at most " + short(policy.MaxRestartGrace)},
		policy.AnnotationDrainSettle: {func(v string) string { return v + " == 'ready' || " + boundedDuration(v, policy.MaxDrainSettle) },
			"a duration such as 10m (at most " + short(policy.MaxDrainSettle) + "), or ready"},
		policy.AnnotationRespectPDB:    {bools, "true or false"},
		policy.AnnotationTaintUpcoming: {bools, "true or false"},
		policy.AnnotationReschedule:    {bools, "true or false"},
		policy.AnnotationEventWindow:   {bools, "true or false"},
		policy.AnnotationMode:          {oneOf(policy.ModeActive, policy.ModeShadow), policy.ModeActive + " or " + policy.ModeShadow},
		policy.AnnotationHoldWhileAlertsUnreachable: {oneOf(policy.UnreachableHold, policy.UnreachableDrain),
			policy.UnreachableHold + " or " + policy.UnreachableDrain},
		// The name expression must compile as the router compiles it (anchored); CEL's matches()
		// fails on one that does not, and the failure policy refuses the write. Label matchers
		// ({...}) are left to the router's parser.
		policy.AnnotationHoldWhileAlerts: {func(v string) string {
			return fmt.Sprintf("%s != '' && (%s.contains('{') || type(''.matches('^(?:' + %s + ')$')) == bool)", v, v, v)
		}, "an alert-name regular expression, optionally followed by {label matchers}"},
	}
	for _, k := range event.InstanceKinds {
		g[policy.ActionKey(k)] = actions
	}
	for _, t := range event.ScheduledTypes {
		if policy.RebootsInPlace(t) {
			g[policy.ScheduledActionKey(t)] = rebootActions
		} else {
			g[policy.ScheduledActionKey(t)] = actions
		}
	}
	for _, k := range policy.Annotations() {
		if _, ok := g[k]; !ok && k != policy.AnnotationWindowSchedule && k != policy.AnnotationWindowDuration {
			return nil, fmt.Errorf("%s: the router reads it but deploy/admission has no rule for it: add one to grammars", k)
		}
	}
	for k := range g {
		if !slices.Contains(policy.Annotations(), k) {
			return nil, fmt.Errorf("%s: a rule for a key router/policy does not read", k)
		}
	}
	return g, nil
}

// variables are the policy's CEL variables: the annotations (a), the ones before an UPDATE
// (old), the router's keys the write adds or changes (changed: only they are checked, so that a
// pool annotated before the policy existed is not locked against Karpenter's own writes), and
// the maintenance window's two values.
func variables() [][2]string {
	s, d := cel(policy.AnnotationWindowSchedule), cel(policy.AnnotationWindowDuration)
	return [][2]string{
		{"a", "has(object.metadata.annotations) ? object.metadata.annotations : {}"},
		{"old", "request.operation == 'UPDATE' && has(oldObject.metadata.annotations) ? oldObject.metadata.annotations : {}"},
		{"changed", fmt.Sprintf("variables.a.filter(k, k.startsWith(%s) && !(k in variables.old && variables.old[k] == variables.a[k]))", cel(policy.Prefix))},
		{"ws", fmt.Sprintf("%s in variables.a ? variables.a[%s].trim() : ''", s, s)},
		{"wd", fmt.Sprintf("%s in variables.a ? variables.a[%s].trim() : ''", d, d)},
		{"windowChanged", fmt.Sprintf("variables.ws != (%s in variables.old ? variables.old[%s].trim() : '') || variables.wd != (%s in variables.old ? variables.old[%s].trim() : '')", s, s, d, d)},
		// cron: the schedule's fields, without its zone.
		{"cron", `variables.ws.findAll('[^\\s]+').filter(f, !f.startsWith('TZ=') && !f.startsWith('CRON_TZ='))`},
		// gap: a bound on the longest time between two openings of the schedule, for the
		// schedules whose bound is plain (every minute, hour or day); 0s for the others, which
		// the router's parser alone checks.
		{"gap", "variables.cron == ['@hourly'] ? duration('1h') : variables.cron in [['@daily'], ['@midnight']] ? duration('24h') : " +
			"size(variables.cron) == 5 && variables.cron[2] in ['*', '?'] && variables.cron[3] in ['*', '?'] && variables.cron[4] in ['*', '?'] ? " +
			"(variables.cron[1] in ['*', '?'] ? (variables.cron[0] in ['*', '?'] ? duration('1m') : duration('1h')) : duration('24h')) : duration('0s')"},
	}
}

// windowValidations are the rules of window-schedule and window-duration, which the router
// reads together: both or neither, each valid, and a window that closes between two openings.
func windowValidations() []validation {
	s, d := policy.AnnotationWindowSchedule, policy.AnnotationWindowDuration
	validDuration := fmt.Sprintf("variables.wd.matches(%s) && duration(variables.wd) > duration('0s') && duration(variables.wd) <= duration(%s)", cel(durationRE), cel(policy.MaxWindowDuration.String()))
	return []validation{
		{"!variables.windowChanged || (variables.ws == '') == (variables.wd == '')",
			fmt.Sprintf("%s and %s: set both, or neither", s, d)},
		{fmt.Sprintf("!variables.windowChanged || variables.ws == '' || variables.ws.matches(%s)", cel(cronRE())),
			fmt.Sprintf("%s: want a cron schedule of 5 fields (minute hour day-of-month month day-of-week) in UTC, optionally prefixed CRON_TZ=Zone/Name", s)},
		{"!variables.windowChanged || variables.wd == '' || (" + validDuration + ")",
			fmt.Sprintf("%s: want a positive duration such as 4h, at most %s", d, short(policy.MaxWindowDuration))},
		{fmt.Sprintf("!variables.windowChanged || variables.gap == duration('0s') || !(variables.ws.matches(%s) && %s) || duration(variables.wd) < variables.gap", cel(cronRE()), validDuration),
			fmt.Sprintf("%s: the window must close between two openings of %s (shorter than the time between them)", d, s)},
	}
}

// matchCondition is true for a write that adds, changes or removes one of the router's
// annotations (matchConditions cannot use the policy's variables).
func matchCondition() string {
	p := cel(policy.Prefix)
	return "(has(object.metadata.annotations) && object.metadata.annotations.exists(k, k.startsWith(" + p + ") && " +
		"!(request.operation == 'UPDATE' && has(oldObject.metadata.annotations) && k in oldObject.metadata.annotations && oldObject.metadata.annotations[k] == object.metadata.annotations[k]))) || " +
		"(request.operation == 'UPDATE' && has(oldObject.metadata.annotations) && oldObject.metadata.annotations.exists(k, k.startsWith(" + p + ") && " +
		"!(has(object.metadata.annotations) && k in object.metadata.annotations)))"
}

// Template renders the chart template of the policy and its binding.
func Template() ([]byte, error) {
	g, err := grammars()
	if err != nil {
		return nil, err
	}
	var vs []validation
	for _, k := range policy.Annotations() {
		r, ok := g[k]
		if !ok {
			continue
		}
		v := fmt.Sprintf("variables.a[%s].trim()", cel(k))
		vs = append(vs, validation{
			expression: fmt.Sprintf("!(%s in variables.changed) || (%s)", cel(k), r.rule(v)),
			message:    fmt.Sprintf("%s: want %s", k, r.want),
		})
	}
	vs = append(vs, windowValidations()...)
	reschedule := cel(policy.AnnotationReschedule)
	vs = append(vs, validation{
		fmt.Sprintf("!(%s in variables.changed || variables.windowChanged) || !(%s in variables.a && variables.a[%s].trim() in ['1', 't', 'T', 'TRUE', 'true', 'True']) || (variables.ws != '' && variables.wd != '')", reschedule, reschedule, reschedule),
		fmt.Sprintf("%s: needs a maintenance window (%s and %s) to move events into", policy.AnnotationReschedule, policy.AnnotationWindowSchedule, policy.AnnotationWindowDuration),
	})
	eventWindow := cel(policy.AnnotationEventWindow)
	vs = append(vs, validation{
		fmt.Sprintf("!(%s in variables.changed || variables.windowChanged) || !(%s in variables.a && variables.a[%s].trim() in ['1', 't', 'T', 'TRUE', 'true', 'True']) || (variables.ws != '' && variables.wd != '')", eventWindow, eventWindow, eventWindow),
		fmt.Sprintf("%s: needs a maintenance window (%s and %s) to hand to EC2", policy.AnnotationEventWindow, policy.AnnotationWindowSchedule, policy.AnnotationWindowDuration),
	})
	known := make([]string, 0, len(policy.Annotations()))
	for _, k := range policy.Annotations() {
		known = append(known, cel(k))
	}
	knownList := "[" + strings.Join(known, ", ") + "]"

	var b bytes.Buffer
	b.WriteString(`# Generated by go run ./deploy/admission deploy/charts/health-router from router/policy's
# annotation table: do not edit. It refuses, when they are written, the healthrouter.io/
# annotations of a NodePool that the router's parser would ignore (docs/policy.md).
{{- if and .Values.admissionPolicies.nodePoolAnnotations.enabled (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy") }}
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {{ include "health-router.fullname" . }}-nodepool-annotations
  labels:
    {{- include "health-router.labels" . | nindent 4 }}
  {{- with .Values.additionalAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  # An expression that fails (a regular expression that does not compile, a duration past
  # time.Duration) refuses the write: such a value is one the router would ignore too.
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: ["karpenter.sh"]
        apiVersions: ["v1"]
        operations: ["CREATE", "UPDATE"]
        resources: ["nodepools"]
  # Only writes that add, change or remove a healthrouter.io/ annotation are evaluated at all:
  # every other write of a NodePool (Karpenter's own) passes without the rules below, whatever
  # the API server makes of them.
  matchConditions:
    - name: healthrouter-annotations-written
      expression: ` + yamlString(matchCondition()) + `
  variables:
`)
	for _, v := range variables() {
		fmt.Fprintf(&b, "    - name: %s\n      expression: %s\n", v[0], yamlString(v[1]))
	}
	b.WriteString("  validations:\n")
	vs = append(vs, validation{})
	vs[len(vs)-1] = validation{
		fmt.Sprintf("variables.changed.all(k, k in %s)", knownList),
		"", // messageExpression below
	}
	for i, v := range vs {
		fmt.Fprintf(&b, "    - expression: %s\n", yamlString(v.expression))
		if i == len(vs)-1 {
			fmt.Fprintf(&b, "      messageExpression: %s\n", yamlString(fmt.Sprintf("'unknown annotation ' + variables.changed.filter(k, !(k in %s)).join(', ') + ': the router reads no such key (a typo?); its keys are listed in docs/policy.md'", knownList)))
		} else {
			fmt.Fprintf(&b, "      message: %s\n", yamlString(v.message))
		}
		b.WriteString("      reason: Invalid\n")
	}
	b.WriteString(`---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ include "health-router.fullname" . }}-nodepool-annotations
  labels:
    {{- include "health-router.labels" . | nindent 4 }}
  {{- with .Values.additionalAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  policyName: {{ include "health-router.fullname" . }}-nodepool-annotations
  validationActions: ["Deny"]
{{- end }}
`)
	return b.Bytes(), nil
}

// cel quotes s as a CEL string literal.
func cel(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// yamlString quotes s as a YAML (JSON) double-quoted string; it never holds "{{", which helm
// would read as a template action.
func yamlString(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		panic(err) // a string always encodes
	}
	out := strings.TrimSuffix(b.String(), "\n")
	if strings.Contains(out, "{{") {
		panic("a CEL expression holds {{: " + s)
	}
	return out
}

// short writes a duration as an annotation would: 72h, 15m, 90s (the router's own).
func short(d time.Duration) string { return policy.Short(d) }
