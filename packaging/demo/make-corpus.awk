# cotrain demo corpus: short, simple English stories, generated
# deterministically (the same bytes with any awk: a Park-Miller generator, not
# rand()).  Written for cotrain and placed in the public domain.
#
#   awk -f packaging/demo/make-corpus.awk > packaging/demo/corpus.txt
function rnd(k) { seed = (seed * 16807) % 2147483647; return int(seed / 2147483647 * k) }
function pick(list,    a, n) { n = split(list, a, "|"); return a[rnd(n) + 1] }
function cap(s) { return toupper(substr(s, 1, 1)) substr(s, 2) }
BEGIN {
	seed = 20261121
	if (n == "") n = 800
	names = "Tom|Lily|Max|Mia|Ben|Sue|Sam|Anna|Leo|Rosa|Finn|Ivy|Jack|Nora|Omar|Zoe"
	animals = "cat|dog|fox|rabbit|bird|mouse|bear|duck|frog|owl|horse|goat"
	adjs = "little|happy|brave|curious|sleepy|kind|shy|clever|tiny|big|quiet|funny"
	places = "small house|big forest|quiet village|sunny farm|busy town|green valley|old mill|warm cave"
	marks = "river|hill|lake|sea|bridge|old tree|tall tower|market"
	acts = "run in the grass|read old books|sing songs|look at the clouds|bake bread|play with a ball|count the stars|pick red apples|swim in the water|draw pictures"
	objs = "shiny stone|red box|blue feather|lost key|small map|golden bell|wooden boat|funny hat|warm blanket|strange seed"
	spots = "a big rock|the bed|a pile of leaves|the table|a bush|the bridge|the stairs|an old tree"
	feels = "happy|surprised|excited|a bit scared|curious|proud|glad"
	friends = "a wise owl|an old turtle|a friendly bee|a tall giraffe|a small bird|a kind farmer|a lost puppy|a busy squirrel"
	quotes = "What is this?|Look what I found!|I wonder who lost it.|This is the best day ever!|Can you help me?|Let us find out together.|I will keep it safe."
	ends = "From that day on, they were the best of friends.|They laughed and went home for dinner.|And that night, everyone slept very well.|The sun went down, and the sky turned pink.|It was a good day, and they were happy.|They promised to meet again the next morning."
	for (i = 0; i < n; i++) {
		name = pick(names); animal = pick(animals)
		pr = rnd(2) ? "she" : "he"
		obj = pick(objs); fr = pick(friends)
		printf "Once upon a time, there was a %s %s named %s. ", pick(adjs), animal, name
		printf "%s lived in a %s near the %s. ", name, pick(places), pick(marks)
		printf "Every day, %s liked to %s.\n", pr, pick(acts)
		printf "One day, %s found a %s under %s. %s felt %s. ", name, obj, pick(spots), cap(pr), pick(feels)
		printf "\"%s\" said %s.\n", pick(quotes), name
		printf "Then %s met %s. %s wanted to %s too, so they went to the %s together. ", name, fr, cap(fr), pick(acts), pick(marks)
		printf "%s\n\n", pick(ends)
	}
}
