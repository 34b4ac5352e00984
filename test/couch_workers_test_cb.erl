%% @doc Membership callback for the tests: forwards every call to the pid
%% set with couch_workers_test_util:set_sink/2.
-module(couch_workers_test_cb).

-behaviour(couch_workers).

-export([couch_workers_membership_update/4]).

couch_workers_membership_update(Type, Workers, VS, Ref) ->
    case persistent_term:get({couch_workers_test_sink, Type}, undefined) of
        Pid when is_pid(Pid) -> Pid ! {cb, ?MODULE, Type, Workers, VS, Ref};
        undefined -> ok
    end.
