package app.rbac_test

import rego.v1

import data.app.rbac

test_admin_can_delete if rbac.allow with input as {"user": "alice", "action": "delete", "resource": "documents"}

test_editor_can_write if rbac.allow with input as {"user": "bob", "action": "write", "resource": "documents"}

test_viewer_cannot_write if not rbac.allow with input as {"user": "carol", "action": "write", "resource": "documents"}

test_unknown_user_denied if not rbac.allow with input as {"user": "mallory", "action": "read", "resource": "documents"}

test_runtime_account_roles_apply if rbac.allow with input as {"user": "dave", "action": "write", "resource": "documents"}
	with data.accounts as {"dave": {"roles": ["editor"]}}

test_runtime_viewer_cannot_write if not rbac.allow with input as {"user": "dave", "action": "write", "resource": "documents"}
	with data.accounts as {"dave": {"roles": ["viewer"]}}
