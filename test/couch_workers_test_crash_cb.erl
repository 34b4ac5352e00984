%% @doc Membership callback that reports the call, then crashes.
-module(couch_workers_test_crash_cb).

-behaviour(couch_workers).

-export([couch_workers_membership_update/4]).

couch_workers_membership_update(Type, Workers, VS, Ref) ->
    case persistent_term:get({couch_workers_test_sink, Type}, undefined) of
        Pid when is_pid(Pid) -> Pid ! {cb, ?MODULE, Type, Workers, VS, Ref};
        undefined -> ok
    end,
    erlang:error({test_callback_crash, Type}).
