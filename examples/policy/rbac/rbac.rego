# Role-based access control for a small document service.
#
# Ask: POST /v1/data/app/rbac/allow {"input": {"user": "alice", "action": "read", "resource": "documents"}}
package app.rbac

import rego.v1

default allow := false

# A user may act on a resource when one of their roles grants that action on it.
allow if {
	some grant in user_grants
	grant.action == input.action
	grant.resource == input.resource
}

# Admins may do anything.
allow if "admin" in user_roles

user_roles contains role if {
	some role in data.rbac.users[input.user].roles
}

# Accounts provisioned at runtime: the data updater writes them to
# data.accounts (examples/data/accounts.json, then data updates), next to the
# users shipped in this bundle.
user_roles contains role if {
	some role in data.accounts[input.user].roles
}

user_grants contains grant if {
	some role in user_roles
	some grant in data.rbac.roles[role]
}

# Why a request was denied, for logs and debugging.
reason := "no role grants this action" if {
	not allow
	count(user_roles) > 0
}

reason := "unknown user" if {
	not allow
	count(user_roles) == 0
}
