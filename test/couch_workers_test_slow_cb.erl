%% @doc Membership callback that takes 2 s for every call, then reports it.
-module(couch_workers_test_slow_cb).

-behaviour(couch_workers).

-export([couch_workers_membership_update/4]).

-define(DELAY_MS, 2000).

couch_workers_membership_update(Type, Workers, VS, Ref) ->
    timer:sleep(?DELAY_MS),
    case persistent_term:get({couch_workers_test_sink, Type}, undefined) of
        Pid when is_pid(Pid) -> Pid ! {cb, ?MODULE, Type, Workers, VS, Ref};
        undefined -> ok
    end.
