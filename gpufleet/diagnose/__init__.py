"""Why did this work fail: evidence from the cluster, matched against the pattern bank in
policies/diagnosis/ (see docs/diagnosis.md)."""
