%% @doc Membership callback that reports each call to the sink
%% (couch_workers_test_util:set_sink/2) as
%% {cb_called, self(), Type, Workers, VS, Ref} and then waits until the
%% sink sends `release' to the calling process.
-module(couch_workers_test_block_cb).

-behaviour(couch_workers).

-export([couch_workers_membership_update/4]).

couch_workers_membership_update(Type, Workers, VS, Ref) ->
    case persistent_term:get({couch_workers_test_sink, Type}, undefined) of
        Pid when is_pid(Pid) ->
            Pid ! {cb_called, self(), Type, Workers, VS, Ref},
            receive
                release -> ok
            end;
        undefined ->
            ok
    end.
