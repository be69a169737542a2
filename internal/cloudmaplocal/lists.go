package cloudmaplocal

import (
	"encoding/base64"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// paginate cuts one page from sorted keys. The token is the last key of the
// previous page, so pages stay correct while items come and go.
func paginate(keys []string, token string, maxResults *int32, def int) ([]string, string, error) {
	start, end, next, err := pageOf(len(keys), func(i int) string { return keys[i] }, token, maxResults, def)
	if err != nil {
		return nil, "", err
	}
	return keys[start:end], next, nil
}

// pageOf is paginate over n sorted keys, key(i) the i-th: the page's
// bounds and the token of the next.
func pageOf(n int, key func(int) string, token string, maxResults *int32, def int) (start, end int, next string, err error) {
	limit := def
	if maxResults != nil {
		limit = int(*maxResults)
	}
	if token != "" {
		last, err := base64.RawURLEncoding.DecodeString(token)
		if err != nil {
			return 0, 0, "", errorf("InvalidInput", "NextToken %q is not valid", token)
		}
		start = sort.Search(n, func(i int) bool { return key(i) >= string(last) })
		if start < n && key(start) == string(last) {
			start++
		}
	}
	end = min(start+limit, n)
	if end < n {
		next = base64.RawURLEncoding.EncodeToString([]byte(key(end - 1)))
	}
	return start, end, next, nil
}

func pageKeyNewestFirst(t time.Time, id string) string {
	return fmt.Sprintf("%020d-%s", math.MaxInt64-t.UnixNano(), id)
}

func pageKeyOldestFirst(t time.Time, id string) string {
	return fmt.Sprintf("%020d-%s", t.UnixNano(), id)
}

// filterSpec says which conditions a filter name accepts.
type filterSpec map[string][]string

// checkFilter validates one filter and normalises its condition (EQ when
// omitted); EQ and BEGINS_WITH take exactly one value, BETWEEN two.
func checkFilter(spec filterSpec, name, cond string, values []string) (string, error) {
	if cond == "" {
		cond = "EQ"
	}
	allowed, ok := spec[name]
	if !ok || !slices.Contains(allowed, cond) {
		return "", errorf("InvalidInput", "Condition %s is not supported for filter %s", cond, name)
	}
	switch cond {
	case "EQ", "BEGINS_WITH":
		if len(values) != 1 {
			return "", errorf("InvalidInput", "Filter %s with condition %s takes exactly one value", name, cond)
		}
	case "BETWEEN":
		if len(values) != 2 {
			return "", errorf("InvalidInput", "Filter %s with condition BETWEEN takes a start and an end date", name)
		}
	}
	return cond, nil
}

func matchValue(cond string, values []string, v string) bool {
	switch cond {
	case "BEGINS_WITH":
		return strings.HasPrefix(v, values[0])
	default: // EQ, IN
		return slices.Contains(values, v)
	}
}

func operationFilter(filters []OperationFilter) (func(*operationRec, string) bool, error) {
	spec := filterSpec{
		"NAMESPACE_ID": {"EQ"}, "SERVICE_ID": {"EQ"},
		"STATUS": {"EQ", "IN"}, "TYPE": {"EQ", "IN"}, "UPDATE_DATE": {"BETWEEN"},
	}
	var preds []func(*operationRec, string) bool
	for _, f := range filters {
		cond, err := checkFilter(spec, f.Name, f.Condition, f.Values)
		if err != nil {
			return nil, err
		}
		values := f.Values
		switch f.Name {
		case "NAMESPACE_ID":
			preds = append(preds, func(op *operationRec, _ string) bool { return matchValue(cond, values, op.Targets["NAMESPACE"]) })
		case "SERVICE_ID":
			preds = append(preds, func(op *operationRec, _ string) bool { return matchValue(cond, values, op.Targets["SERVICE"]) })
		case "STATUS":
			preds = append(preds, func(_ *operationRec, status string) bool { return matchValue(cond, values, status) })
		case "TYPE":
			preds = append(preds, func(op *operationRec, _ string) bool { return matchValue(cond, values, op.Type) })
		case "UPDATE_DATE":
			from, err1 := parseEpoch(values[0])
			to, err2 := parseEpoch(values[1])
			if err1 != nil || err2 != nil {
				return nil, errorf("InvalidInput", "UPDATE_DATE values must be Unix times in seconds, got %v", values)
			}
			preds = append(preds, func(op *operationRec, _ string) bool {
				return !op.UpdateDate.Before(from) && !op.UpdateDate.After(to)
			})
		}
	}
	return func(op *operationRec, status string) bool {
		for _, p := range preds {
			if !p(op, status) {
				return false
			}
		}
		return true
	}, nil
}

func parseEpoch(s string) (time.Time, error) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return time.Time{}, err
	}
	sec, frac := math.Modf(f)
	return time.Unix(int64(sec), int64(frac*1e9)), nil
}
