"""The broker's security: who a client is, what it may do, how fast it may go.

* authentication: `tls` (listeners' SSL contexts, client certificates), `sasl` (PLAIN and
  SCRAM sessions, the SASL state table), `loglake users` reaching a running broker
  (`users_inbox`);
* authorization: `authorizer` (ACL bindings indexed for decisions; `acl_rules`: which
  operation a request needs), `authorized` (the checks handlers call);
* quotas: `quotas` (client byte-rate and request quotas, Kafka's windows and throttling),
  `mutation_quota` (controller_mutation_rate).

The SCRAM math itself is `loglake.scram`, below the metadata layer: the metadata validates the
credentials it stores with it.
"""
