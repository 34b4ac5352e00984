%% @doc A worker's owner on a peer node, driven from the test node (not a
%% suite). `start/5' (through `peer:call/5') registers a worker in a
%% long-lived process of the peer, registered as `Name'; the other
%% functions ask that process to act and answer with plain terms:
%% references do not travel between non-distributed nodes, so the owner
%% records only whether each message it got names its own `Ref'.
-module(couch_workers_test_owner).

-export([start/4, accept/1, finish_old/1, events/1, stop/1]).
%% Leadership messages, kept apart from `events/1'.
-export([leader_events/1]).

-define(WAIT, 10000).

%% Registers `(Type, Id)' with `Opts' for a new owner process `Name'.
-spec start(atom(), binary(), binary(), map()) -> ok | {error, term()}.
start(Name, Type, Id, Opts) ->
    Caller = self(),
    Pid = spawn(fun() ->
        Result = couch_workers:worker_register(Type, Id, Opts, self()),
        Caller ! {registered, self(), Result},
        case is_reference(Result) of
            true -> loop(#{ref => Result, events => [], job => undefined, leader => []});
            false -> ok
        end
    end),
    receive
        {registered, Pid, Ref} when is_reference(Ref) -> true = register(Name, Pid), ok;
        {registered, Pid, Error} -> Error
    after ?WAIT -> {error, timeout}
    end.

%% Takes a pending job and keeps its handle: `{ok, JobId}'.
-spec accept(atom()) -> {ok, binary()} | {error, term()}.
accept(Name) -> ask(Name, accept).

%% Finishes the job with the handle `accept/1' kept: its answer.
-spec finish_old(atom()) -> ok | {error, term()}.
finish_old(Name) -> ask(Name, finish_old).

%% The owner messages so far, oldest first: `reaped' or `{lost, Reason}'
%% for its own `Ref', `{other_ref, Msg}' for anything else.
-spec events(atom()) -> [term()].
events(Name) -> ask(Name, events).

%% The leadership messages for its own `Ref' so far, oldest first:
%% `{leader, Epoch}' and `{leader_lost, Epoch}'.
-spec leader_events(atom()) -> [{leader | leader_lost, binary()}].
leader_events(Name) -> ask(Name, leader_events).

-spec stop(atom()) -> ok.
stop(Name) ->
    case whereis(Name) of
        undefined -> ok;
        Pid -> Pid ! stop, ok
    end.

ask(Name, Request) ->
    Name ! {Request, self()},
    receive
        {Name, Answer} -> Answer
    after ?WAIT -> {error, timeout}
    end.

loop(#{ref := Ref, events := Events} = St) ->
    receive
        {couch_workers_worker_reaped, Ref} ->
            loop(St#{events := [reaped | Events]});
        {couch_workers_worker_lost, Ref, Reason} ->
            loop(St#{events := [{lost, Reason} | Events]});
        {couch_workers_leader, Ref, Epoch} ->
            loop(St#{leader := [{leader, Epoch} | maps:get(leader, St)]});
        {couch_workers_leader_lost, Ref, Epoch} ->
            loop(St#{leader := [{leader_lost, Epoch} | maps:get(leader, St)]});
        {leader_events, From} ->
            reply(From, lists:reverse(maps:get(leader, St))),
            loop(St);
        {couch_workers_worker_reaped, _} = Msg ->
            loop(St#{events := [{other_ref, Msg} | Events]});
        {couch_workers_worker_lost, _, _} = Msg ->
            loop(St#{events := [{other_ref, Msg} | Events]});
        {accept, From} ->
            case couch_workers:job_accept(Ref, #{timeout => 5000}) of
                {ok, #{id := Id} = Job} ->
                    reply(From, {ok, Id}),
                    loop(St#{job := Job});
                Error ->
                    reply(From, Error),
                    loop(St)
            end;
        {finish_old, From} ->
            reply(From, couch_workers:job_finish(maps:get(job, St), #{})),
            loop(St);
        {events, From} ->
            reply(From, lists:reverse(Events)),
            loop(St);
        stop ->
            ok
    end.

reply(From, Answer) ->
    {registered_name, Name} = process_info(self(), registered_name),
    From ! {Name, Answer}.
