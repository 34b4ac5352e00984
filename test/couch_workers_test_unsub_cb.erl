%% @doc Membership callback that unsubscribes its own subscription on its
%% first call, and reports {unsubscribed, Ref, Result} on every call.
-module(couch_workers_test_unsub_cb).

-behaviour(couch_workers).

-export([couch_workers_membership_update/4]).

couch_workers_membership_update(Type, _Workers, _VS, Ref) ->
    Result = couch_workers:membership_unsubscribe(Ref),
    case persistent_term:get({couch_workers_test_unsub_sink, Type}, undefined) of
        Pid when is_pid(Pid) -> Pid ! {unsubscribed, Ref, Result};
        undefined -> ok
    end.
