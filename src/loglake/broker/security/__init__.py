"""The broker's security: who a client is, what it may do, how fast it may go.

* authentication: `tls` (listeners' SSL contexts, client certificates), `sasl` (PLAIN,
  SCRAM and OAUTHBEARER sessions, KIP-368 re-authentication, the SASL state table),
  `oauthbearer` (bearer tokens: the unsecured and JWKS validators), SCRAM credentials kept in the metadata
  (`scram_store`), `loglake users` reaching a running broker (`users_inbox`);
* authorization: `authorizer` (ACL bindings indexed for decisions; `acl_rules`: which
  operation a request needs), `authorized` (the checks handlers call), the bindings kept in the
  metadata (`acl_store`);
* quotas: `quotas` (client byte-rate and request quotas, Kafka's windows and throttling),
  `mutation_quota` (controller_mutation_rate), the quota configs kept in the metadata
  (`quota_store`).

The SCRAM math itself is `loglake.scram`, below the metadata layer: the metadata validates the
credentials it stores with it.
"""
